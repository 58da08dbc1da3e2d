//! Where sandbox egress may go: host patterns (`host`, `host:port`,
//! `*.domain`, `*`) and the addresses a name resolves to, which must be
//! public unless the operator allows private ones.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Ports a pattern without one allows.
const WEB_PORTS: [u16; 2] = [80, 443];

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    host: Host,
    /// `None`: 80 and 443.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// `*`: any host.
    Any,
    /// `*.example.com`: any subdomain of `example.com` (not itself).
    Suffix(String),
    Exact(String),
}

impl HostPattern {
    /// `host`, `host:port`, `*.domain[:port]`, `*[:port]`, `[v6]:port`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("empty host pattern".into());
        }
        if text.contains("://") || text.contains('/') {
            return Err(format!("{text:?}: a host or host:port, not a URL"));
        }
        let (host, port) = split_port(text)?;
        let host = host.to_ascii_lowercase();
        let host = if host == "*" {
            Host::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            valid_name(domain).then(|| Host::Suffix(domain.to_string())).ok_or_else(|| bad(text))?
        } else if host.parse::<IpAddr>().is_ok() || valid_name(&host) {
            Host::Exact(host)
        } else {
            return Err(bad(text));
        };
        Ok(Self { host, port })
    }

    pub fn matches(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => WEB_PORTS.contains(&port),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        port_ok
            && match &self.host {
                Host::Any => true,
                Host::Exact(h) => h == host,
                Host::Suffix(domain) => {
                    host.len() > domain.len() + 1
                        && host.ends_with(domain.as_str())
                        && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                }
            }
    }

    /// Whether everything this pattern allows is allowed by one of
    /// `within` (the operator's patterns, where no port means any port).
    pub fn within(&self, within: &[HostPattern]) -> bool {
        within.iter().any(|outer| {
            // An operator's pattern without a port allows any port.
            let port_ok = match (outer.port, self.port) {
                (None, _) => true,
                (Some(o), Some(p)) => o == p,
                (Some(_), None) => false,
            };
            port_ok
                && match (&outer.host, &self.host) {
                    (Host::Any, _) => true,
                    (Host::Exact(o), Host::Exact(h)) => o == h,
                    (Host::Suffix(o), Host::Exact(h)) => h.ends_with(&format!(".{o}")),
                    (Host::Suffix(o), Host::Suffix(h)) => h == o || h.ends_with(&format!(".{o}")),
                    _ => false,
                }
        })
    }
}

fn bad(text: &str) -> String {
    format!("{text:?} is not a host name, an IP address, `*.domain` or `*`")
}

fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(|| bad(text))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(parse_port(p, text)?),
            None if after.is_empty() => None,
            None => return Err(bad(text)),
        };
        return Ok((v6, port));
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Ok((host, Some(parse_port(port, text)?))),
        _ => Ok((text, None)),
    }
}

fn parse_port(port: &str, text: &str) -> Result<u16, String> {
    port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| format!("{text:?}: the port must be 1-65535"))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
        })
}

/// Addresses egress must not reach unless the operator allows private
/// ones: loopback, RFC 1918, carrier-grade NAT, link-local (cloud metadata
/// included), unique-local and site-local, multicast, unspecified; and an
/// IPv4 address carried inside IPv6 (mapped, compatible, NAT64, 6to4,
/// Teredo) is judged as that IPv4 address, since the host's stack or a
/// gateway on its path delivers it there.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => private_v6(v6) || embedded_v4(v6).iter().any(|v4| private_v4(*v4)),
    }
}

/// The IPv4 addresses an IPv6 address carries.
fn embedded_v4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let low = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated).
        [0, 0, 0, 0, 0, 0xffff, ..] | [0, 0, 0, 0, 0xffff, 0, ..] => vec![low],
        // ::a.b.c.d, IPv4-compatible (deprecated, still routed by some stacks).
        [0, 0, 0, 0, 0, 0, ..] => vec![low],
        // 64:ff9b::/96, the NAT64 well-known prefix, and 64:ff9b:1::/48 (local use).
        [0x64, 0xff9b, 0, 0, 0, 0, ..] | [0x64, 0xff9b, 1, ..] => vec![low],
        // 2002:AABB:CCDD::/48, 6to4.
        [0x2002, ..] => vec![Ipv4Addr::new(o[2], o[3], o[4], o[5])],
        // 2001:0::/32, Teredo: the server, and the client (stored inverted).
        [0x2001, 0, ..] => vec![Ipv4Addr::new(o[4], o[5], o[6], o[7]), Ipv4Addr::from(!u32::from(low))],
        _ => Vec::new(),
    }
}

fn private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (18..20).contains(&b))
        || a >= 240
}

fn private_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        // fec0::/10, site-local (deprecated, still private where used).
        || (first & 0xffc0) == 0xfec0
        // 64:ff9b:1::/48 is for a network's own NAT64 only.
        || (first == 0x64 && ip.segments()[1] == 0xff9b && ip.segments()[2] == 1)
}

/// The addresses of `host:port` egress may connect to: all of them when
/// private ones are allowed, else the public ones; an error says why none.
pub async fn resolve(host: &str, port: u16, private_ok: bool) -> Result<Vec<SocketAddr>, String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let all: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?
            .collect(),
    };
    if all.is_empty() {
        return Err(format!("{host} has no address"));
    }
    let allowed: Vec<SocketAddr> =
        all.iter().copied().filter(|a| private_ok || !is_private(a.ip())).collect();
    if allowed.is_empty() {
        return Err(format!(
            "{host} resolves to a private address ({}), which the operator's policy refuses \
             (egress_private_addresses)",
            all[0].ip()
        ));
    }
    Ok(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> HostPattern {
        HostPattern::parse(text).unwrap()
    }

    #[test]
    fn patterns_match_hosts_and_ports() {
        assert!(p("registry.npmjs.org").matches("registry.npmjs.org", 443));
        assert!(p("registry.npmjs.org").matches("Registry.NPMJS.org.", 80));
        assert!(!p("registry.npmjs.org").matches("registry.npmjs.org", 22));
        assert!(!p("registry.npmjs.org").matches("evil-registry.npmjs.org", 443));
        assert!(p("127.0.0.1:8080").matches("127.0.0.1", 8080));
        assert!(!p("127.0.0.1:8080").matches("127.0.0.1", 8081));
        assert!(p("*.github.com").matches("api.github.com", 443));
        assert!(!p("*.github.com").matches("github.com", 443));
        assert!(!p("*.github.com").matches("evilgithub.com", 443));
        assert!(p("*:22").matches("anything.example", 22));
        assert!(p("[::1]:9000").matches("[::1]", 9000));
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        for text in
            ["", "https://x.org", "x.org/path", "x.org:0", "x.org:99999", "a..b", "*.", "-a.org", "a b"]
        {
            assert!(HostPattern::parse(text).is_err(), "{text:?} was accepted");
        }
    }

    #[test]
    fn a_tenant_pattern_must_sit_within_the_operators() {
        let operator = [p("*.npmjs.org"), p("pypi.org")];
        assert!(p("registry.npmjs.org").within(&operator));
        assert!(p("*.npmjs.org").within(&operator));
        assert!(p("pypi.org:443").within(&operator));
        assert!(p("pypi.org:8080").within(&operator));
        assert!(!p("pypi.org").within(&[p("pypi.org:8080")]));
        assert!(!p("*").within(&operator));
        assert!(!p("example.com").within(&operator));
        assert!(p("anything.example:8080").within(&[p("*:8080")]));
        assert!(p("example.com").within(&[p("*")]));
    }

    #[test]
    fn private_addresses_are_recognized() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "104.16.0.1", "2606:4700::1111"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    /// One test per IPv6 range that carries (or is) a private address:
    /// each embeds 127.0.0.1 / 10.0.0.1 / 169.254.169.254 and must be
    /// refused, while the same range around a public IPv4 address is not.
    #[test]
    fn nat64_addresses_are_judged_by_their_ipv4() {
        assert!(is_private("64:ff9b::127.0.0.1".parse().unwrap()));
        assert!(is_private("64:ff9b::a9fe:a9fe".parse().unwrap()));
        assert!(!is_private("64:ff9b::1.1.1.1".parse().unwrap()));
        assert!(is_private("64:ff9b:1::8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn six_to_four_addresses_are_judged_by_their_ipv4() {
        assert!(is_private("2002:7f00:1::1".parse().unwrap()));
        assert!(is_private("2002:a9fe:a9fe::".parse().unwrap()));
        assert!(is_private("2002:0a00:0001::1".parse().unwrap()));
        assert!(!is_private("2002:0101:0101::1".parse().unwrap()));
    }

    #[test]
    fn ipv4_compatible_addresses_are_judged_by_their_ipv4() {
        assert!(is_private("::127.0.0.1".parse().unwrap()));
        assert!(is_private("::10.0.0.1".parse().unwrap()));
        assert!(is_private("::169.254.169.254".parse().unwrap()));
        assert!(!is_private("::1.1.1.1".parse().unwrap()));
        assert!(is_private("::ffff:0:127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn site_local_addresses_are_private() {
        assert!(is_private("fec0::1".parse().unwrap()));
        assert!(is_private("feff:ffff::1".parse().unwrap()));
    }

    #[test]
    fn teredo_addresses_are_judged_by_their_server_and_client_ipv4() {
        // Server 127.0.0.1.
        assert!(is_private("2001:0:7f00:1::1".parse().unwrap()));
        // Client 10.0.0.1, stored inverted (f5ff:fffe).
        assert!(is_private("2001:0:0101:0101:0:0:f5ff:fffe".parse().unwrap()));
        // Server and client public (1.1.1.1, 8.8.8.8 inverted).
        assert!(!is_private("2001:0:0101:0101:0:0:f7f7:f7f7".parse().unwrap()));
    }

    #[tokio::test]
    async fn resolving_refuses_private_addresses_unless_allowed() {
        let refused = resolve("127.0.0.1", 80, false).await.unwrap_err();
        assert!(
            refused.contains("private address") && refused.contains("egress_private_addresses"),
            "{refused}"
        );
        assert_eq!(resolve("127.0.0.1", 80, true).await.unwrap(), ["127.0.0.1:80".parse().unwrap()]);
        assert!(resolve("localhost", 80, false).await.is_err());
    }
}

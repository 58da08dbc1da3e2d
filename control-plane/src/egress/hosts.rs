//! Where sandbox egress may go: host patterns (`shared::hosts`) and the
//! addresses a name resolves to, which must be public unless the operator
//! allows private ones.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub use shared::hosts::HostPattern;

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

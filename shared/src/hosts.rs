//! Host patterns (`host`, `host:port`, `*.domain`, `*`): where a
//! sandbox's egress may go, and where a brokered credential may be sent.
//! The control plane decides by them; the sandbox agent reads them to know
//! which connections to intercept.

use std::net::IpAddr;

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
}

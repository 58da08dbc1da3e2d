//! Host patterns (`host`, `host:port`, `*.domain`, `*`): where a
//! sandbox's egress may go, and where a brokered credential may be sent.
//! The control plane decides by them; the sandbox agent reads them to know
//! which connections to intercept. And what the egress rules by method and
//! path are judged on: an HTTP request as a `shared::policy` subject
//! (`METHOD host:port/path`, [`request_subject`]) and a rule as a glob over
//! it ([`request_pattern`]).

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

/// Glob metacharacters escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "*?[]{}\\".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl HostPattern {
    /// The glob over `host:port` this pattern stands for (an IPv6 address
    /// in brackets).
    pub fn glob(&self) -> String {
        let host = match &self.host {
            Host::Any => "*".to_string(),
            Host::Suffix(domain) => format!("*.{}", escape(domain)),
            Host::Exact(h) if h.contains(':') => escape(&format!("[{h}]")),
            Host::Exact(h) => escape(h),
        };
        let port = match self.port {
            Some(p) => p.to_string(),
            None => format!("{{{},{}}}", WEB_PORTS[0], WEB_PORTS[1]),
        };
        format!("{host}:{port}")
    }
}

/// The `shared::policy` pattern (action `request`) of an egress rule: any
/// of `methods` (none: any method) to `host`, on a path matching `path` (a
/// glob; none: any path).
pub fn request_pattern(host: &HostPattern, methods: &[String], path: Option<&str>) -> String {
    let methods: Vec<String> = methods.iter().map(|m| escape(&m.to_ascii_uppercase())).collect();
    let methods = match methods.len() {
        0 => "*".to_string(),
        1 => methods[0].clone(),
        _ => format!("{{{}}}", methods.join(",")),
    };
    let path = match path {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => "{,/**}".to_string(),
    };
    format!("{methods} {}{path}", host.glob())
}

/// The `shared::policy` subject of a request: `METHOD host:port/path`,
/// the path as [`normal_path`] gives it.
pub fn request_subject(method: &str, host: &str, port: u16, path: &str) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase();
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    format!("{} {host}:{port}{path}", method.to_ascii_uppercase())
}

/// A request target's path as rules judge it: the query left out,
/// percent-escapes decoded. Refused (`Err` says why): a path that does not
/// start with `/`, has a `.` or `..` segment, or an escaped `/`, `\\`, or
/// control character, any of which a server may read as another path than
/// the one judged.
pub fn normal_path(target: &str) -> Result<String, String> {
    let raw = target.split(['?', '#']).next().unwrap_or_default();
    if !raw.starts_with('/') {
        return Err(format!("{raw:?} is not an absolute path"));
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("{raw:?} has a malformed percent-escape"))?;
                if byte == b'/' || byte == b'\\' || byte.is_ascii_control() {
                    return Err(format!("{raw:?} escapes a separator or a control character"));
                }
                out.push(byte);
                i += 3;
            }
            b'\\' => return Err(format!("{raw:?} has a backslash")),
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    let path = String::from_utf8(out).map_err(|_| format!("{raw:?} is not UTF-8 once decoded"))?;
    if path.split('/').any(|segment| segment == "." || segment == "..") {
        return Err(format!("{raw:?} has a `.` or `..` segment"));
    }
    Ok(path)
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

    #[test]
    fn request_rules_judge_method_host_port_and_path() {
        use crate::policy::{Action, Effect, Policy, Rule};
        let rule = |host: &str, methods: &[&str], path: Option<&str>, effect| Rule {
            action: Action::Request,
            pattern: request_pattern(
                &p(host),
                &methods.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
                path,
            ),
            effect,
        };
        let policy = Policy {
            default: Effect::Deny,
            rules: vec![
                rule("api.github.com", &["GET"], Some("/repos/acme/**"), Effect::Allow),
                rule("*.example.org", &[], None, Effect::Allow),
                rule("bad.example.org", &["POST", "put"], None, Effect::Deny),
                rule("[::1]:8080", &[], Some("/v1/*"), Effect::Allow),
            ],
            ..Default::default()
        };
        policy.validate().unwrap();
        let decide = |m: &str, h: &str, port: u16, path: &str| {
            policy.decide(Action::Request, &request_subject(m, h, port, &normal_path(path).unwrap())).effect
        };
        assert_eq!(decide("GET", "api.github.com", 443, "/repos/acme/x"), Effect::Allow);
        assert_eq!(decide("get", "API.github.com.", 443, "/repos/acme/x/pulls/1"), Effect::Allow);
        assert_eq!(decide("POST", "api.github.com", 443, "/repos/acme/x"), Effect::Deny);
        assert_eq!(decide("GET", "api.github.com", 443, "/repos/other/x"), Effect::Deny);
        assert_eq!(decide("GET", "api.github.com", 8443, "/repos/acme/x"), Effect::Deny);
        assert_eq!(decide("GET", "api.github.com", 443, "/repos/acme"), Effect::Deny);
        assert_eq!(decide("DELETE", "a.example.org", 80, "/"), Effect::Allow);
        assert_eq!(decide("GET", "a.b.example.org", 443, "/any/path"), Effect::Allow);
        assert_eq!(decide("PUT", "bad.example.org", 443, "/x"), Effect::Deny);
        assert_eq!(decide("GET", "bad.example.org", 443, "/x"), Effect::Allow);
        assert_eq!(decide("GET", "::1", 8080, "/v1/models"), Effect::Allow);
        assert_eq!(decide("GET", "::1", 8080, "/v1/models/x"), Effect::Deny);
        assert_eq!(normal_path("/repos/acme/x?q=1").unwrap(), "/repos/acme/x");
        assert_eq!(normal_path("/repos/%61cme/x").unwrap(), "/repos/acme/x");
        for hostile in
            ["/repos/acme/../other", "/repos/acme/%2e%2e/other", "/repos/acme%2fx", "/a\\b", "x", "/%zz"]
        {
            assert!(normal_path(hostile).is_err(), "{hostile}");
        }
    }
}

//! A user given as `uid[:gid]` or `name[:group]`, resolved against the texts
//! of an image's `/etc/passwd` and `/etc/group`: the control plane checks a
//! definition's run user with it, the agent resolves the same string inside
//! the sandbox, so both always agree.

/// What a passwd entry says of a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub uid: u32,
    pub gid: u32,
    /// The entry's name and home, when the image has an entry for the uid.
    pub name: Option<String>,
    pub home: Option<String>,
}

/// Why a user string does not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    #[error("user {0:?} is not in the image's /etc/passwd")]
    UnknownUser(String),
    #[error("group {0:?} is not in the image's /etc/group")]
    UnknownGroup(String),
}

/// Only a group given by name needs `/etc/group`.
pub fn needs_group_file(user: &str) -> bool {
    user.split_once(':').is_some_and(|(_, g)| g.parse::<u32>().is_err())
}

/// Whether the ids of `user` need `/etc/passwd`: not when both are given
/// as numbers (`uid:gid`); a name, or a uid alone (its group is the
/// entry's), does. The entry's name and home still come from the file.
pub fn needs_passwd_file(user: &str) -> bool {
    match user.split_once(':') {
        Some((u, g)) => u.parse::<u32>().is_err() || g.parse::<u32>().is_err(),
        None => true,
    }
}

/// `user` resolved against the texts of `/etc/passwd` and `/etc/group`.
/// Docker's rule for the group: the one given, else the user's primary
/// group, else group 0.
pub fn resolve(user: &str, passwd: &str, groups: &str) -> Result<Resolved, UserError> {
    let (who, group) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let numeric = who.parse::<u32>().ok();
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && (f[0] == who || (numeric.is_some() && f[2] == who)));
    let uid = match numeric {
        Some(uid) => uid,
        None => entry
            .as_ref()
            .and_then(|f| f[2].parse().ok())
            .ok_or_else(|| UserError::UnknownUser(who.to_string()))?,
    };
    let gid = match group {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| UserError::UnknownGroup(g.to_string()))?,
        },
        None => entry.as_ref().and_then(|f| f[3].parse().ok()).unwrap_or(0),
    };
    let name = entry.as_ref().map(|f| f[0].to_string());
    let home = entry.as_ref().and_then(|f| f.get(5)).filter(|h| h.starts_with('/')).map(|h| h.to_string());
    Ok(Resolved { uid, gid, name, home })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1001::/home/agent:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\nagent:x:1001:\n";

    fn ids(user: &str, groups: &str) -> (u32, u32) {
        let r = resolve(user, PASSWD, groups).unwrap();
        (r.uid, r.gid)
    }

    #[test]
    fn names_and_numbers_resolve_against_the_image() {
        assert_eq!(ids("agent", ""), (1000, 1001), "primary group");
        assert_eq!(ids("1000", ""), (1000, 1001), "a known uid keeps its group");
        assert_eq!(ids("4242", ""), (4242, 0), "an unknown uid gets group 0");
        assert_eq!(ids("agent:50", ""), (1000, 50));
        assert_eq!(ids("agent:staff", GROUP), (1000, 50));
        assert!(!needs_group_file("agent") && !needs_group_file("agent:50"));
        assert!(needs_group_file("agent:staff"));
        assert!(!needs_passwd_file("10001:10001"));
        let without = resolve("1000:50", "", "").unwrap();
        assert_eq!((without.uid, without.gid), ids("1000:50", ""), "numbers need no file");
        for user in ["agent", "1000", "agent:50", "1000:staff"] {
            assert!(needs_passwd_file(user), "{user}");
        }
    }

    #[test]
    fn an_entry_gives_its_name_and_home() {
        let r = resolve("1000", PASSWD, "").unwrap();
        assert_eq!((r.name.as_deref(), r.home.as_deref()), (Some("agent"), Some("/home/agent")));
        let r = resolve("10001:10001", PASSWD, "").unwrap();
        assert_eq!((r.uid, r.gid, r.name, r.home), (10001, 10001, None, None));
    }

    #[test]
    fn unknown_names_are_errors() {
        assert_eq!(resolve("nobody-here", PASSWD, ""), Err(UserError::UnknownUser("nobody-here".into())));
        assert_eq!(resolve("agent:wheel", PASSWD, GROUP), Err(UserError::UnknownGroup("wheel".into())));
    }
}

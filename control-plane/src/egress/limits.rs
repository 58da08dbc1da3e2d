//! How many connections a sandbox's egress may hold open on this host at
//! once: each carried connection is a socket of the control plane's
//! process, so one tenant's sandbox opening connections without end would
//! exhaust it for every tenant. A connection over a limit is refused (the
//! sandbox's client gets a 403 naming the limit), never queued.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// Connections one sandbox's carriers (one driver of it) may hold open.
pub const PER_SANDBOX: usize = 64;
/// Connections all of one tenant's sandboxes may hold open on this replica.
pub const PER_TENANT: usize = 256;
/// The longest host name egress dials (DNS's own maximum).
pub const MAX_HOST: usize = 253;

/// Open connections per tenant in this process. One count for the
/// process, not one per service: the sockets are the process's.
static TENANTS: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Mutex::default);

/// The limits of one sandbox's carriers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Limits {
    tenant: String,
    sandbox: Arc<Mutex<usize>>,
    per_sandbox: usize,
    per_tenant: usize,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    limits: Limits,
}

impl Limits {
    /// The limits of a sandbox of `tenant`.
    pub fn new(tenant: &str) -> Self {
        Self::with(tenant, PER_SANDBOX, PER_TENANT)
    }

    pub fn with(tenant: &str, per_sandbox: usize, per_tenant: usize) -> Self {
        Self { tenant: tenant.to_string(), sandbox: Arc::default(), per_sandbox, per_tenant }
    }

    /// A place for one more connection, or why there is none.
    pub fn admit(&self) -> Result<Slot, String> {
        let mut sandbox = self.sandbox.lock().expect("egress limits poisoned");
        if *sandbox >= self.per_sandbox {
            return Err(format!(
                "the sandbox holds {} egress connections open, the most one sandbox may; close one first",
                self.per_sandbox
            ));
        }
        let mut tenants = TENANTS.lock().expect("egress limits poisoned");
        let held = tenants.entry(self.tenant.clone()).or_default();
        if *held >= self.per_tenant {
            return Err(format!(
                "the tenant's sandboxes hold {} egress connections open on this server, the most one tenant \
                 may; close one first",
                self.per_tenant
            ));
        }
        *held += 1;
        *sandbox += 1;
        Ok(Slot { limits: self.clone() })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.limits.sandbox.lock().expect("egress limits poisoned") -= 1;
        let mut tenants = TENANTS.lock().expect("egress limits poisoned");
        if let Some(held) = tenants.get_mut(&self.limits.tenant) {
            *held -= 1;
            if *held == 0 {
                tenants.remove(&self.limits.tenant);
            }
        }
    }
}

/// `host` cut to [`MAX_HOST`] bytes (on a character boundary) for records:
/// a sandbox's made-up name must not fill the run's log.
pub fn bounded(host: &str) -> String {
    if host.len() <= MAX_HOST {
        return host.to_string();
    }
    let mut end = MAX_HOST;
    while !host.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &host[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_and_a_tenant_hold_at_most_their_limit() {
        let tenant = format!("limits-{}", uuid::Uuid::new_v4().simple());
        let a = Limits::with(&tenant, 2, 3);
        let b = Limits::with(&tenant, 2, 3);
        let held: Vec<Slot> = vec![a.admit().unwrap(), a.admit().unwrap()];
        assert!(a.admit().unwrap_err().contains("one sandbox"));
        let third = b.admit().unwrap();
        assert!(b.admit().unwrap_err().contains("one tenant"));
        // Another tenant is not counted with this one.
        let other = Limits::with(&format!("{tenant}-other"), 2, 3);
        let _other = other.admit().unwrap();
        drop(third);
        let _again = b.admit().unwrap();
        drop(held);
        let _a = a.admit().unwrap();
        assert_eq!(bounded(&"x".repeat(10_000)).len(), MAX_HOST + '…'.len_utf8());
        assert_eq!(bounded("registry.npmjs.org"), "registry.npmjs.org");
    }
}

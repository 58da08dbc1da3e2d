//! How many connections a sandbox's egress may hold open on this host at
//! once: each carried connection is a socket of the control plane's
//! process, so one tenant's sandbox opening connections without end would
//! exhaust it for every tenant. A connection over a limit is refused (the
//! sandbox's client gets a 403 naming the limit), never queued. The limits
//! are the operator's (`egress_max_connections_per_sandbox`,
//! `egress_max_connections_per_tenant`); the count per tenant is one
//! server's, held by its [`EgressLimits`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The longest host name egress dials (DNS's own maximum).
pub const MAX_HOST: usize = 253;

/// One server's egress limits and the connections each tenant holds open
/// against them. Cheap to clone: clones share the count.
#[derive(Debug, Clone)]
pub struct EgressLimits {
    per_sandbox: usize,
    per_tenant: usize,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

impl EgressLimits {
    /// At most `per_sandbox` connections per sandbox and `per_tenant` for
    /// all of a tenant's sandboxes; 0: no maximum.
    pub fn new(per_sandbox: usize, per_tenant: usize) -> Self {
        Self { per_sandbox, per_tenant, tenants: Arc::default() }
    }

    /// The limits of one of `tenant`'s sandboxes (one driver of it): its
    /// own count, the tenant's shared with every other sandbox of it here.
    pub fn sandbox(&self, tenant: &str) -> Limits {
        Limits { server: self.clone(), tenant: tenant.to_string(), sandbox: Arc::default() }
    }
}

/// The limits of one sandbox's carriers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Limits {
    server: EgressLimits,
    tenant: String,
    sandbox: Arc<Mutex<usize>>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    limits: Limits,
}

/// Whether `held` more would pass `max` (0: no maximum).
fn full(held: usize, max: usize) -> bool {
    max > 0 && held >= max
}

impl Limits {
    /// A place for one more connection, or why there is none.
    pub fn admit(&self) -> Result<Slot, String> {
        let (per_sandbox, per_tenant) = (self.server.per_sandbox, self.server.per_tenant);
        let mut sandbox = self.sandbox.lock().expect("egress limits poisoned");
        if full(*sandbox, per_sandbox) {
            return Err(format!(
                "the sandbox holds {per_sandbox} egress connections open, the most one sandbox may; close one \
                 first"
            ));
        }
        let mut tenants = self.server.tenants.lock().expect("egress limits poisoned");
        let held = tenants.entry(self.tenant.clone()).or_default();
        if full(*held, per_tenant) {
            return Err(format!(
                "the tenant's sandboxes hold {per_tenant} egress connections open on this server, the most one \
                 tenant may; close one first"
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
        let mut tenants = self.limits.server.tenants.lock().expect("egress limits poisoned");
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
        let server = EgressLimits::new(2, 3);
        let a = server.sandbox("acme");
        let b = server.sandbox("acme");
        let held: Vec<Slot> = vec![a.admit().unwrap(), a.admit().unwrap()];
        assert!(a.admit().unwrap_err().contains("holds 2 egress connections open, the most one sandbox may"));
        let third = b.admit().unwrap();
        assert!(b.admit().unwrap_err().contains("hold 3 egress connections open on this server"));
        // Another tenant is not counted with this one.
        let _other = server.sandbox("globex").admit().unwrap();
        drop(third);
        let _again = b.admit().unwrap();
        drop(held);
        let _a = a.admit().unwrap();
        assert_eq!(bounded(&"x".repeat(10_000)).len(), MAX_HOST + '…'.len_utf8());
        assert_eq!(bounded("registry.npmjs.org"), "registry.npmjs.org");
    }

    #[test]
    fn each_server_counts_its_own_and_zero_is_no_maximum() {
        let (one, two) = (EgressLimits::new(8, 1), EgressLimits::new(8, 1));
        let _held = one.sandbox("acme").admit().unwrap();
        assert!(one.sandbox("acme").admit().is_err());
        // The same tenant on another server in this process.
        let _there = two.sandbox("acme").admit().unwrap();
        let unlimited = EgressLimits::new(0, 0).sandbox("acme");
        let held: Vec<Slot> = (0..1_000).map(|_| unlimited.admit().unwrap()).collect();
        assert_eq!(held.len(), 1_000);
    }
}

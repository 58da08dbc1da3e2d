//! Warm pools: sandboxes of a definition kept created, set up and idle, so
//! an ensure for a new thread claims one instead of creating it.
//!
//! A definition asks with `lifecycle.warm = N`; `PutDefinition` records the
//! pool ([`crate::store::WarmStore::set_pool`]). The keeper
//! ([`run_warm_keeper`], on every replica) reconciles each pool under a
//! lease of its own, so one replica at a time makes its sandboxes: each is
//! created under a fresh random key, set up with no secret value (secrets
//! arrive with the claim, as with every ensure), and recorded `ready`. A
//! claim is one store statement ([`crate::store::WarmStore::claim`]), so no
//! two ensures on any replicas get the same sandbox; the claimed sandbox
//! becomes the thread's instance and the keeper is woken to refill.
//!
//! What a pool never does: hand one tenant's sandbox to another (pools
//! are per tenant and definition), hand over a sandbox of an older version
//! of the definition (claims match the definition's digest), or outlive
//! its definition (the keeper destroys sandboxes no pool wants).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use shared::proto::v1 as api;
use shared::proto::v1::EnsureOutcome;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::key::pool_digest;
use super::lifecycle::{EnsureInput, Located, connect, provider_kind, spec_for};
use super::{Error, Lifecycle, definition};
use crate::lease::Leases;
use crate::provider::{Provider, ProviderKind};
use crate::provision::{InvalidField, Progress};
use crate::store::{Stores, Tenant, Timestamp, WarmSandbox, WarmState};

/// How often the keeper looks at every pool when nothing wakes it.
const KEEP_EVERY: Duration = Duration::from_secs(5);

/// How long a claimed sandbox's row is kept (what `pools ls` counts).
const CLAIMED_KEPT: Duration = Duration::from_secs(24 * 3600);

/// How many claims an ensure tries when a claimed sandbox turns out gone.
const CLAIM_TRIES: usize = 3;

/// The pool `definition` asks for, refused when it cannot have one: a pool
/// is set up before any run, with no secret value, so a workspace whose
/// clone needs a secret cannot be pooled; and at most the operator's
/// maximum.
pub(super) fn check(definition: &api::SandboxDefinition, max: u32) -> Result<u32, Error> {
    let warm = definition.lifecycle.as_ref().map_or(0, |l| l.warm);
    if warm == 0 {
        return Ok(0);
    }
    if warm > max {
        let why = format!("at most {max} (the operator's max_warm_per_definition)");
        return Err(InvalidField::new("lifecycle.warm", why).into());
    }
    if let Some(name) = crate::workspace::git_auth_secrets(definition).into_iter().next() {
        let why = format!(
            "a warm pool sets its sandboxes up before any run, without secret values, and this workspace needs \
             secret {name} to fetch; drop `warm` or the secret"
        );
        return Err(InvalidField::new("lifecycle.warm", why).into());
    }
    Ok(warm)
}

impl Lifecycle {
    /// For an ensure that would create the thread's sandbox `key`: a ready
    /// sandbox of the definition's pool, claimed and recorded as the
    /// thread's. `None`: the definition has no pool, or none is ready.
    pub(super) async fn claim_warm(
        &self,
        stores: &Stores,
        input: &EnsureInput,
        key: &str,
        kind: ProviderKind,
        lease: &crate::lease::Lease,
    ) -> Result<Option<Located>, Error> {
        if input.definition.lifecycle.as_ref().is_none_or(|l| l.warm == 0) {
            return Ok(None);
        }
        let digest = pool_digest(&input.definition, input.tenant.as_str());
        for _ in 0..CLAIM_TRIES {
            let claimed = stores.warm.claim(&input.tenant, &input.definition.id, &digest, key).await?;
            let Some(pooled) = claimed else { break };
            // Where the pool placed it (under the same definition's
            // requirements): this server's providers, or a node.
            let provider = match self.provider_on(&pooled.node, kind).await {
                Ok(provider) => provider,
                Err(e) => {
                    warn!(pool_key = %pooled.pool_key, node = %pooled.node, error = %e, "a claimed pooled sandbox's node is gone; claiming another");
                    let _ = stores.warm.remove(&pooled.pool_key).await;
                    continue;
                }
            };
            let (sandbox, held) = match self.warm.take(&pooled.pool_key) {
                Some((sandbox, agent)) if super::lifecycle::answers(&agent).await => (sandbox, Some(agent)),
                _ => match provider.resume(&pooled.provider_sandbox_id).await? {
                    Some(sandbox) => (sandbox, None),
                    None => {
                        warn!(pool_key = %pooled.pool_key, "a claimed pooled sandbox is gone; claiming another");
                        let _ = stores.warm.remove(&pooled.pool_key).await;
                        continue;
                    }
                },
            };
            let instance = self
                .record(stores, key, input, (&pooled.node, provider.as_ref()), &sandbox, None, lease)
                .await;
            // The pool is short of one now (also when the record failed:
            // the claimed sandbox is then the reaper's as an orphan).
            self.warm.wake();
            let instance = instance?;
            crate::metrics::sandboxes().warm_claim(true);
            info!(sandbox_key = %key, pool_key = %pooled.pool_key, "sandbox claimed from the warm pool");
            let capabilities = provider.capabilities();
            return Ok(Some(Located {
                sandbox,
                outcome: EnsureOutcome::Claimed,
                instance,
                held,
                provider,
                capabilities,
            }));
        }
        self.warm.wake();
        crate::metrics::sandboxes().warm_claim(false);
        debug!(sandbox_key = %key, definition_id = %input.definition.id, "warm pool empty; creating");
        Ok(None)
    }

    /// One pass over every pool: refill what is short, remove what no pool
    /// wants (an older version of the definition, a pool made smaller or
    /// gone, a creation a dead replica left), each pool under its lease.
    pub async fn keep_pools(&self, stores: &Stores, leases: &Leases) {
        let (pools, pooled) = match (stores.warm.pools().await, stores.warm.list(None).await) {
            (Ok(pools), Ok(pooled)) => (pools, pooled),
            (Err(e), _) | (_, Err(e)) => {
                warn!(error = %e, "reading the warm pools failed");
                return;
            }
        };
        let mut by_pool: HashMap<(Tenant, String), Vec<WarmSandbox>> = HashMap::new();
        for sandbox in pooled {
            by_pool.entry((sandbox.tenant.clone(), sandbox.definition_id.clone())).or_default().push(sandbox);
        }
        let mut ready = 0u64;
        for pool in pools {
            let sandboxes =
                by_pool.remove(&(pool.tenant.clone(), pool.definition_id.clone())).unwrap_or_default();
            ready += self
                .keep_pool(stores, leases, &pool.tenant, &pool.definition_id, pool.target, sandboxes)
                .await;
        }
        // Pools that are gone: their unclaimed sandboxes go too.
        for ((tenant, definition_id), sandboxes) in by_pool {
            self.keep_pool(stores, leases, &tenant, &definition_id, 0, sandboxes).await;
        }
        crate::metrics::sandboxes().warm_ready(ready);
    }

    /// Reconcile one pool; returns how many of its sandboxes are ready.
    async fn keep_pool(
        &self,
        stores: &Stores,
        leases: &Leases,
        tenant: &Tenant,
        definition_id: &str,
        target: u32,
        sandboxes: Vec<WarmSandbox>,
    ) -> u64 {
        let name = format!("warm:{}", short_digest(tenant.as_str(), definition_id));
        let lease = match leases.try_acquire(&name).await {
            Ok(Some(lease)) => lease,
            // Another replica keeps this pool now.
            Ok(None) => return count(&sandboxes, WarmState::Ready),
            Err(e) => {
                debug!(error = %e, "the warm pool's lease is unavailable");
                return count(&sandboxes, WarmState::Ready);
            }
        };
        let definition = if target == 0 {
            None
        } else {
            match stores.definitions.get(tenant, definition_id).await {
                Ok(stored) => definition::from_stored(&stored.body).ok(),
                Err(_) => None,
            }
        };
        let digest = definition.as_ref().map(|d| pool_digest(d, tenant.as_str()));
        let now = Timestamp::now().as_millis();
        let age =
            |t: Timestamp| Duration::from_millis(u64::try_from(now - t.as_millis()).unwrap_or_default());
        let mut unclaimed = 0u32;
        for sandbox in &sandboxes {
            let stale = match sandbox.state {
                WarmState::Claimed => {
                    if sandbox.claimed_at.is_some_and(|t| age(t) > CLAIMED_KEPT) {
                        let _ = stores.warm.remove(&sandbox.pool_key).await;
                    }
                    continue;
                }
                // Under the pool's lease nobody else is making one: this
                // was left by a keeper that died or lost the lease (its
                // `ready` then finds no row and destroys what it made).
                // The sandbox, if any, is the reaper's as an orphan.
                WarmState::Creating => true,
                WarmState::Ready => digest.as_deref() != Some(sandbox.digest.as_str()) || unclaimed >= target,
            };
            if stale {
                self.discard(stores, sandbox).await;
            } else {
                unclaimed += 1;
            }
        }
        let mut made = 0u32;
        if let Some(definition) = &definition {
            while unclaimed + made < target && !lease.is_lost() {
                let started = Instant::now();
                match self.make_pooled(stores, tenant, definition).await {
                    Ok(()) => {
                        made += 1;
                        crate::metrics::sandboxes().warm_refilled(started.elapsed());
                        let _ = stores.warm.set_pool_error(tenant, definition_id, "").await;
                    }
                    Err(e) => {
                        let shown = shared::error::Error::from(e).message;
                        warn!(tenant = %tenant, definition_id, error = %shown, "refilling a warm pool failed");
                        let _ = stores.warm.set_pool_error(tenant, definition_id, &shown).await;
                        break;
                    }
                }
            }
        }
        let _ = lease.release().await;
        let ready_before = sandboxes
            .iter()
            .filter(|s| s.state == WarmState::Ready && digest.as_deref() == Some(s.digest.as_str()))
            .count() as u64;
        ready_before.min(u64::from(target)) + u64::from(made)
    }

    /// Make one sandbox for the tenant's pool of `definition`.
    async fn make_pooled(
        &self,
        stores: &Stores,
        tenant: &Tenant,
        definition: &api::SandboxDefinition,
    ) -> Result<(), Error> {
        let kind = provider_kind(definition)?;
        self.policy.check_on_host(definition, tenant.as_str())?;
        // Placed as a thread's new sandbox would be: a node of the fleet
        // that satisfies the definition, else this server's providers.
        let placed = self.place(None, kind, definition).await?;
        let provider = placed.provider;
        let workspace = definition.workspace.clone().unwrap_or_default();
        self.provisioner.check(&workspace)?;
        let pool_key = hex::encode(rand::random::<[u8; 32]>());
        let spec = spec_for(definition, &pool_key, tenant, &self.policy);
        provider.supports(&spec).await?;
        // Counted against the tenant's quota from here, as a row once added.
        let slot = self.quota.admit(stores, tenant).await?;
        let row = WarmSandbox {
            pool_key: pool_key.clone(),
            tenant: tenant.clone(),
            definition_id: definition.id.clone(),
            digest: pool_digest(definition, tenant.as_str()),
            provider: kind.as_str().to_string(),
            node: placed.node.clone(),
            provider_sandbox_id: String::new(),
            state: WarmState::Creating,
            claimed_key: None,
            created_at: Timestamp::now(),
            claimed_at: None,
        };
        self.quota.settle(slot, stores.warm.add(&row)).await?;
        // The row counts the sandbox on its node from here.
        drop(placed.reservation);
        let made = async {
            let sandbox = provider.create(&spec).await?;
            let input = EnsureInput {
                tenant: tenant.clone(),
                definition: definition.clone(),
                thread_id: String::new(),
                run_id: String::new(),
                secrets: Default::default(),
            };
            // No native snapshot of a pooled sandbox: it is claimed whole.
            let lifecycle =
                api::Lifecycle { snapshot: api::SnapshotPolicy::Never as i32, ..Default::default() };
            let discard = Progress::discard();
            if let Err(e) =
                self.provision(&input, provider.as_ref(), &sandbox, &workspace, &lifecycle, &discard).await
            {
                self.destroy_quietly(provider.as_ref(), &sandbox.provider_id).await;
                return Err(e);
            }
            Ok(sandbox)
        }
        .await;
        let sandbox = match made {
            Ok(sandbox) => sandbox,
            Err(e) => {
                let _ = stores.warm.remove(&pool_key).await;
                return Err(e);
            }
        };
        if !stores.warm.ready(&pool_key, &sandbox.provider_id).await? {
            // Its row went meanwhile (the keeper of another replica judged
            // it left behind): the sandbox is no pool's.
            self.destroy_quietly(provider.as_ref(), &sandbox.provider_id).await;
            return Ok(());
        }
        match connect(&sandbox.address, &sandbox.token).await {
            Ok(agent) => self.warm.hold(&pool_key, sandbox, agent),
            Err(e) => debug!(pool_key = %pool_key, error = %e, "holding a pooled sandbox's agent failed"),
        }
        info!(tenant = %tenant, definition_id = %definition.id, pool_key = %pool_key, "warm pool sandbox ready");
        Ok(())
    }

    /// Destroy a pooled sandbox no pool wants and forget its row.
    async fn discard(&self, stores: &Stores, sandbox: &WarmSandbox) {
        self.warm.take(&sandbox.pool_key);
        let kind = ProviderKind::named(&sandbox.provider);
        if let (false, Some(kind)) = (sandbox.provider_sandbox_id.is_empty(), kind) {
            match self.provider_on(&sandbox.node, kind).await {
                Ok(provider) => self.destroy_quietly(provider.as_ref(), &sandbox.provider_sandbox_id).await,
                // Its provider is off here: the reaper of a replica that
                // has it takes the sandbox as an orphan.
                Err(e) => {
                    debug!(pool_key = %sandbox.pool_key, error = %e, "cannot destroy a pooled sandbox here")
                }
            }
        }
        let _ = stores.warm.remove(&sandbox.pool_key).await;
        info!(tenant = %sandbox.tenant, definition_id = %sandbox.definition_id, pool_key = %sandbox.pool_key,
            "pooled sandbox removed");
    }

    async fn destroy_quietly(&self, provider: &dyn Provider, provider_id: &str) {
        if let Err(e) = provider.destroy(provider_id).await {
            warn!(provider_id, error = %e, "destroying a pooled sandbox failed");
        }
    }

    /// The tenant's pools, as `ListWarmPools` shows them.
    pub async fn list_pools(&self, stores: &Stores, tenant: &Tenant) -> Result<Vec<api::WarmPool>, Error> {
        let pooled = stores.warm.list(Some(tenant)).await?;
        let mut out = Vec::new();
        for p in stores.warm.pools().await?.into_iter().filter(|p| &p.tenant == tenant) {
            // Ready means claimable: made from the definition as it is now.
            let digest = match stores.definitions.get(tenant, &p.definition_id).await {
                Ok(stored) => {
                    definition::from_stored(&stored.body).ok().map(|d| pool_digest(&d, tenant.as_str()))
                }
                Err(_) => None,
            };
            let of = |state: WarmState| {
                pooled
                    .iter()
                    .filter(|s| s.definition_id == p.definition_id && s.state == state)
                    .filter(|s| state != WarmState::Ready || digest.as_deref() == Some(s.digest.as_str()))
                    .count() as u32
            };
            out.push(api::WarmPool {
                definition_id: p.definition_id.clone(),
                tenant: p.tenant.as_str().to_string(),
                target: p.target,
                ready: of(WarmState::Ready),
                claimed: of(WarmState::Claimed),
                refilling: of(WarmState::Creating),
                last_error: p.last_error,
            });
        }
        Ok(out)
    }

    /// Wake the keeper (a pool was set or claimed from).
    pub(crate) fn wake_keeper(&self) {
        self.warm.wake();
    }
}

fn count(sandboxes: &[WarmSandbox], state: WarmState) -> u64 {
    sandboxes.iter().filter(|s| s.state == state).count() as u64
}

/// A lease name for a pool: tenants and definition ids are the callers'.
fn short_digest(tenant: &str, definition_id: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{tenant}\0{definition_id}").as_bytes());
    hex::encode(&digest[..12])
}

/// Keep every pool until `shutdown`: a pass every few seconds, and at once
/// when a claim or a `PutDefinition` wakes it.
pub async fn run_warm_keeper(
    lifecycle: Lifecycle,
    stores: Stores,
    leases: Leases,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = lifecycle.warm.woken() => {}
            _ = tokio::time::sleep(KEEP_EVERY) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = lifecycle.keep_pools(&stores, &leases) => {}
        }
    }
}

//! A container's resource use from the engine's stats, the way `docker
//! stats` reads them: CPU time from the cgroup's counter, memory without
//! the page cache the kernel can drop.

use bollard::models::ContainerStatsResponse;
use bollard::query_parameters::StatsOptions;
use futures::StreamExt;

use super::DockerProvider;
use crate::provider::{Error, ResourceUse, Result};

impl DockerProvider {
    /// One reading of the container's stats (`one-shot`: no wait for a
    /// second sample); `None` for a container that is gone.
    pub(super) async fn stats_once(&self, id: &str) -> Result<Option<ResourceUse>> {
        let options = StatsOptions { stream: false, one_shot: true };
        match self.docker().stats(id, Some(options)).next().await {
            Some(Ok(stats)) => Ok(Some(resource_use(&stats))),
            Some(Err(e)) => match self.engine_error("reading the container's stats", e) {
                Error::NotFound(_) => Ok(None),
                other => Err(other),
            },
            None => Ok(None),
        }
    }
}

/// What one stats answer says; a stopped container's empty stats say
/// nothing (every field unknown).
pub(super) fn resource_use(stats: &ContainerStatsResponse) -> ResourceUse {
    let cpu = stats.cpu_stats.as_ref().and_then(|c| c.cpu_usage.as_ref()?.total_usage);
    let memory = stats.memory_stats.as_ref();
    let usage = memory.and_then(|m| m.usage);
    // cgroup v1 calls the reclaimable cache `total_inactive_file`, v2
    // `inactive_file`.
    let cache = memory
        .and_then(|m| m.stats.as_ref())
        .and_then(|s| s.get("total_inactive_file").or_else(|| s.get("inactive_file")).copied())
        .unwrap_or(0);
    ResourceUse {
        cpu_time: cpu.filter(|&ns| ns > 0).map(std::time::Duration::from_nanos),
        memory_bytes: usage.filter(|&u| u > 0).map(|u| u.saturating_sub(cache)),
        memory_limit_bytes: memory.and_then(|m| m.limit).filter(|&l| l > 0),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::{ContainerCpuStats, ContainerCpuUsage, ContainerMemoryStats};

    use super::*;

    #[test]
    fn memory_leaves_out_the_page_cache_and_cpu_is_the_counter() {
        let stats = ContainerStatsResponse {
            cpu_stats: Some(ContainerCpuStats {
                cpu_usage: Some(ContainerCpuUsage { total_usage: Some(2_500_000_000), ..Default::default() }),
                ..Default::default()
            }),
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(50 << 20),
                limit: Some(512 << 20),
                stats: Some(HashMap::from([("inactive_file".to_string(), 10 << 20)])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let used = resource_use(&stats);
        assert_eq!(used.cpu_time, Some(std::time::Duration::from_millis(2_500)));
        assert_eq!(used.memory_bytes, Some(40 << 20));
        assert_eq!(used.memory_limit_bytes, Some(512 << 20));
    }

    #[test]
    fn a_stopped_containers_empty_stats_are_unknown_not_zero() {
        let empty = ContainerStatsResponse {
            cpu_stats: Some(ContainerCpuStats::default()),
            memory_stats: Some(ContainerMemoryStats::default()),
            ..Default::default()
        };
        assert_eq!(resource_use(&empty), ResourceUse::default());
    }
}

//! Workspace provisioning: what a `WorkspaceDefinition` says, made real in a
//! freshly created sandbox through its agent, in the steps the
//! [`provisioner`] runs; [`violations`] says what makes a definition invalid.
//! Every step fails with [`Error`]: the provisioning error, defined beside
//! the [`Provisioner`](crate::provision::Provisioner) seam so the lifecycle
//! can hold it without importing this module.

mod git;
mod instructions;
mod package_manager;
mod provisioner;
mod remote;
mod setup;
mod skills;
mod violations;

pub use crate::provision::Error;
pub(crate) use git::{auth_secrets as git_auth_secrets, fetch_url};
pub use provisioner::{WorkspaceProvisioner, project_for_run, provisions_anything};
pub use violations::violations;

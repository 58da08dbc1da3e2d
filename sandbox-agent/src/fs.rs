//! `FsService`: files under the sandbox root.
//!
//! Every request path goes through [`Root`] before anything is opened,
//! created or even `stat`ed, so a refused path touches nothing. Operations on
//! an entry itself (lstat, remove, rename, mkdir) resolve without following a
//! final symlink: removing a link removes the link, never what it points to.
//! Reads, writes, stat and exists follow a final symlink only when it stays
//! inside the root.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::UNIX_EPOCH;

use futures::Stream;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1::{
    ExistsRequest, ExistsResponse, FileInfo, FileType, ListDirRequest, ListDirResponse, MakeDirRequest,
    MakeDirResponse, ReadFileRequest, ReadFileResponse, RemoveRequest, RemoveResponse, RenameRequest,
    RenameResponse, StatRequest, StatResponse, WriteFileRequest, WriteFileResponse,
    fs_service_server::FsService, write_file_request,
};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tonic::{Request, Response, Status, Streaming};

use crate::confine::Root;
pub use crate::confine::io_error;
use crate::context::AgentContext;
use crate::run_user::{FsAs, RunUser};

/// Size of one `ReadFile` chunk.
pub const READ_CHUNK: usize = 64 * 1024;
/// Mode of a written file when the request sets none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// Deepest `ListDir` walk.
pub const MAX_LIST_DEPTH: u32 = 64;
/// Most entries one `ListDir` returns (keeps the response under the usual
/// 4 MiB message limit).
pub const MAX_LIST_ENTRIES: usize = 20_000;

fn precondition(path: &str, what: &str) -> Error {
    Error::new(ErrorCode::FailedPrecondition, format!("{path:?}: {what}"))
}

/// Run blocking filesystem work off the async workers, as `user` (the run
/// user) when there is one: what it creates is the user's, and it reaches
/// only what the user could.
async fn blocking<T: Send + 'static>(
    user: Option<RunUser>,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    let as_user = move || {
        let _as = FsAs::new(user.as_ref())?;
        f()
    };
    match tokio::task::spawn_blocking(as_user).await {
        Ok(result) => result.map_err(Status::from),
        Err(e) => Err(Error::internal(format!("filesystem task failed: {e}")).into()),
    }
}

fn file_type(ft: std::fs::FileType) -> FileType {
    if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_dir() {
        FileType::Directory
    } else if ft.is_file() {
        FileType::File
    } else {
        FileType::Other
    }
}

/// What a client sees of the entry at `abs` (never following it).
fn file_info(root: &Root, abs: &Path, meta: &std::fs::Metadata) -> FileInfo {
    let rel = root.relative(abs).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let name = abs.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mtime_ms = match meta.modified() {
        Ok(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        },
        Err(_) => 0,
    };
    let symlink_target = if meta.file_type().is_symlink() {
        std::fs::read_link(abs).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default()
    } else {
        String::new()
    };
    FileInfo {
        path: rel,
        name,
        r#type: file_type(meta.file_type()) as i32,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime_ms,
        symlink_target,
    }
}

/// Refuse operations on the root itself where they make no sense.
fn not_root(root: &Root, abs: &Path, path: &str, what: &str) -> Result<(), Error> {
    if abs == root.path() {
        return Err(Error::invalid_field("path", format!("cannot {what} the sandbox root ({path:?})")));
    }
    Ok(())
}

pub struct Files {
    root: Root,
    run_user: Option<RunUser>,
}

impl Files {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { root: ctx.root.clone(), run_user: ctx.run_user.clone() }
    }
}

/// A temporary file that is removed unless committed by renaming it over
/// its target: an interrupted or failed write leaves the target untouched
/// and no litter behind.
struct TempFile {
    path: PathBuf,
    committed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Walk `dir` down to `depth` levels, never following symlinks.
fn list_dir(root: &Root, dir: &Path, path: &str, depth: u32, out: &mut Vec<FileInfo>) -> Result<(), Error> {
    let mut walk = walkdir::WalkDir::new(dir).min_depth(1).max_depth(depth as usize).into_iter();
    while let Some(entry) = walk.next() {
        // The original io error: its kind and errno pick the code, and its
        // message names no absolute path. (A loop error needs followed links.)
        let entry = entry.map_err(|e| {
            let e = e.into_io_error().unwrap_or_else(|| std::io::Error::other("filesystem loop"));
            io_error(e, path)
        })?;
        let abs = entry.path();
        // An entry removed while listing is simply not listed (nor entered).
        let Ok(meta) = std::fs::symlink_metadata(abs) else {
            if entry.file_type().is_dir() {
                walk.skip_current_dir();
            }
            continue;
        };
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(precondition(
                path,
                &format!("more than {MAX_LIST_ENTRIES} entries; list with a smaller depth"),
            ));
        }
        out.push(file_info(root, abs, &meta));
    }
    Ok(())
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<ReadFileResponse, Status>> + Send>>;

#[tonic::async_trait]
impl FsService for Files {
    type ReadFileStream = ReadStream;

    async fn read_file(
        &self,
        req: Request<ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let req = req.into_inner();
        let root = self.root.clone();
        let path = req.path.clone();
        let file = blocking(self.run_user.clone(), move || {
            let abs = root.resolve(&path)?;
            let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, &path))?;
            if meta.is_dir() {
                return Err(precondition(&path, "is a directory"));
            }
            if !meta.is_file() {
                return Err(precondition(&path, "is not a regular file"));
            }
            // O_NOFOLLOW: the final component was resolved; a symlink
            // swapped in since then is refused rather than followed.
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&abs)
                .map_err(|e| io_error(e, &path))
        })
        .await?;
        let mut file = tokio::fs::File::from_std(file);
        if req.offset > 0 {
            file.seek(std::io::SeekFrom::Start(req.offset)).await.map_err(|e| io_error(e, &req.path))?;
        }
        let limit = if req.limit == 0 { u64::MAX } else { req.limit };
        let path = req.path;
        let stream = async_stream::try_stream! {
            let mut remaining = limit;
            while remaining > 0 {
                let want = remaining.min(READ_CHUNK as u64) as usize;
                let mut buf = vec![0u8; want];
                let mut filled = 0;
                // Fill whole chunks (short reads are legal) so that clients
                // see READ_CHUNK-sized messages.
                while filled < want {
                    let n = file.read(&mut buf[filled..]).await.map_err(|e| Status::from(io_error(e, &path)))?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 {
                    break;
                }
                buf.truncate(filled);
                remaining -= filled as u64;
                let short = filled < want;
                yield ReadFileResponse { data: buf };
                if short {
                    break;
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<WriteFileRequest>>,
    ) -> Result<Response<WriteFileResponse>, Status> {
        let mut inbound = req.into_inner();
        let header = match inbound.message().await? {
            Some(WriteFileRequest { request: Some(write_file_request::Request::Header(h)) }) => h,
            _ => return Err(Error::invalid_field("header", "the first message must carry the header").into()),
        };
        let mode = header.mode.unwrap_or(DEFAULT_FILE_MODE) & 0o7777;
        let root = self.root.clone();
        let path = header.path.clone();
        let make_parents = header.make_parents;
        let (target, temp, file) = blocking(self.run_user.clone(), move || {
            // Follows a final symlink that stays inside the root: writing
            // through a link writes what it points to.
            let target = root.resolve(&path)?;
            not_root(&root, &target, &path, "write")?;
            let parent =
                target.parent().ok_or_else(|| Error::invalid_field("path", "has no parent"))?.to_owned();
            if make_parents {
                std::fs::create_dir_all(&parent).map_err(|e| match e.kind() {
                    // A file where a directory should be.
                    std::io::ErrorKind::AlreadyExists => precondition(&path, "a parent is not a directory"),
                    _ => io_error(e, &path),
                })?;
            }
            match std::fs::metadata(&parent) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(precondition(&path, "parent is not a directory")),
                Err(e) => return Err(io_error(e, &path)),
            }
            if let Ok(meta) = std::fs::symlink_metadata(&target)
                && meta.is_dir()
            {
                return Err(precondition(&path, "is a directory"));
            }
            let temp_path = parent.join(format!(".sandhold-write-{}", uuid::Uuid::new_v4().simple()));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&temp_path)
                .map_err(|e| io_error(e, &path))?;
            Ok((target, TempFile { path: temp_path, committed: false }, file))
        })
        .await?;
        // From here on `temp` is removed on every early return, a client
        // that goes away included (the future is dropped).
        let mut file = tokio::fs::File::from_std(file);
        let mut written: u64 = 0;
        let mut ended = false;
        while let Some(msg) = inbound.message().await? {
            if ended {
                return Err(Error::invalid_field("end", "nothing may follow the end message").into());
            }
            match msg.request {
                Some(write_file_request::Request::End(_)) => ended = true,
                Some(write_file_request::Request::Data(data)) => {
                    tokio::io::AsyncWriteExt::write_all(&mut file, &data)
                        .await
                        .map_err(|e| io_error(e, &header.path))?;
                    written += data.len() as u64;
                }
                Some(write_file_request::Request::Header(_)) => {
                    return Err(
                        Error::invalid_field("header", "only the first message carries a header").into()
                    );
                }
                None => {}
            }
        }
        if header.end_required && !ended {
            return Err(Error::invalid_field(
                "end",
                format!("the upload ended without its end message; {:?} left untouched", header.path),
            )
            .into());
        }
        if let Some(size) = header.size
            && size != written
        {
            return Err(Error::invalid_field(
                "size",
                format!("declared {size} bytes, received {written}; {:?} left untouched", header.path),
            )
            .into());
        }
        let file = file.into_std().await;
        let path = header.path.clone();
        blocking(self.run_user.clone(), move || {
            let mut temp = temp;
            // Exact mode, whatever the umask.
            file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|e| io_error(e, &path))?;
            file.sync_all().map_err(|e| io_error(e, &path))?;
            drop(file);
            std::fs::rename(&temp.path, &target).map_err(|e| io_error(e, &path))?;
            temp.committed = true;
            Ok(())
        })
        .await?;
        Ok(Response::new(WriteFileResponse { bytes_written: written }))
    }

    async fn list_dir(&self, req: Request<ListDirRequest>) -> Result<Response<ListDirResponse>, Status> {
        let req = req.into_inner();
        let root = self.root.clone();
        let entries = blocking(self.run_user.clone(), move || {
            let dir = root.resolve(&req.path)?;
            let meta = std::fs::symlink_metadata(&dir).map_err(|e| io_error(e, &req.path))?;
            if !meta.is_dir() {
                return Err(precondition(&req.path, "is not a directory"));
            }
            let depth = req.depth.clamp(1, MAX_LIST_DEPTH);
            let mut out = Vec::new();
            list_dir(&root, &dir, &req.path, depth, &mut out)?;
            out.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(out)
        })
        .await?;
        Ok(Response::new(ListDirResponse { entries }))
    }

    async fn stat(&self, req: Request<StatRequest>) -> Result<Response<StatResponse>, Status> {
        let path = req.into_inner().path;
        let root = self.root.clone();
        let info = blocking(self.run_user.clone(), move || {
            let abs = root.resolve(&path)?;
            let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, &path))?;
            Ok(file_info(&root, &abs, &meta))
        })
        .await?;
        Ok(Response::new(StatResponse { info: Some(info) }))
    }

    async fn lstat(&self, req: Request<StatRequest>) -> Result<Response<StatResponse>, Status> {
        let path = req.into_inner().path;
        let root = self.root.clone();
        let info = blocking(self.run_user.clone(), move || {
            let abs = root.resolve_no_follow(&path)?;
            let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, &path))?;
            Ok(file_info(&root, &abs, &meta))
        })
        .await?;
        Ok(Response::new(StatResponse { info: Some(info) }))
    }

    async fn make_dir(&self, req: Request<MakeDirRequest>) -> Result<Response<MakeDirResponse>, Status> {
        let req = req.into_inner();
        let root = self.root.clone();
        blocking(self.run_user.clone(), move || {
            let abs = root.resolve_no_follow(&req.path)?;
            match std::fs::symlink_metadata(&abs) {
                // `mkdir -p` of an existing directory succeeds; a link or a
                // file in the way never does (and is never followed).
                Ok(meta) if meta.is_dir() && req.parents => return Ok(()),
                Ok(_) => {
                    return Err(Error::new(
                        ErrorCode::AlreadyExists,
                        format!("{:?} already exists", req.path),
                    ));
                }
                Err(_) => {}
            }
            let made = if req.parents { std::fs::create_dir_all(&abs) } else { std::fs::create_dir(&abs) };
            made.map_err(|e| io_error(e, &req.path))
        })
        .await?;
        Ok(Response::new(MakeDirResponse {}))
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Result<Response<RemoveResponse>, Status> {
        let req = req.into_inner();
        let root = self.root.clone();
        blocking(self.run_user.clone(), move || {
            let abs = root.resolve_no_follow(&req.path)?;
            not_root(&root, &abs, &req.path, "remove")?;
            let meta = std::fs::symlink_metadata(&abs).map_err(|e| io_error(e, &req.path))?;
            let removed = if meta.is_dir() {
                if req.recursive {
                    // Does not follow symlinks inside the tree.
                    std::fs::remove_dir_all(&abs)
                } else {
                    std::fs::remove_dir(&abs)
                }
            } else {
                std::fs::remove_file(&abs)
            };
            removed.map_err(|e| io_error(e, &req.path))
        })
        .await?;
        Ok(Response::new(RemoveResponse {}))
    }

    async fn rename(&self, req: Request<RenameRequest>) -> Result<Response<RenameResponse>, Status> {
        let req = req.into_inner();
        let root = self.root.clone();
        blocking(self.run_user.clone(), move || {
            let from = root
                .resolve_no_follow(&req.from)
                .map_err(|e| Error::from(e).with_violation("from", "refused"))?;
            let to = root
                .resolve_no_follow(&req.to)
                .map_err(|e| Error::from(e).with_violation("to", "refused"))?;
            not_root(&root, &from, &req.from, "rename")?;
            not_root(&root, &to, &req.to, "replace")?;
            std::fs::symlink_metadata(&from).map_err(|e| io_error(e, &req.from))?;
            std::fs::rename(&from, &to).map_err(|e| io_error(e, &format!("{} -> {}", req.from, req.to)))
        })
        .await?;
        Ok(Response::new(RenameResponse {}))
    }

    async fn exists(&self, req: Request<ExistsRequest>) -> Result<Response<ExistsResponse>, Status> {
        let path = req.into_inner().path;
        let root = self.root.clone();
        let exists = blocking(self.run_user.clone(), move || {
            let abs = root.resolve(&path)?;
            Ok(std::fs::symlink_metadata(&abs).is_ok())
        })
        .await?;
        Ok(Response::new(ExistsResponse { exists }))
    }
}

#[cfg(test)]
mod tests {
    use shared::proto::agent::v1::fs_service_client::FsServiceClient;
    use shared::proto::agent::v1::fs_service_server::FsServiceServer;
    use tonic::transport::Server;

    use super::*;
    use crate::testing;

    async fn listed(
        client: &mut FsServiceClient<tonic::transport::Channel>,
        depth: u32,
    ) -> Vec<(String, i32)> {
        let req = ListDirRequest { path: "a".into(), depth };
        let entries = client.list_dir(req).await.unwrap().into_inner().entries;
        entries.into_iter().map(|e| (e.path, e.r#type)).collect()
    }

    #[tokio::test]
    async fn list_dir_walks_to_the_depth_asked_and_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = testing::context(dir.path());
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/c/deep.txt"), "x").unwrap();
        std::fs::write(root.join("a/top.txt"), "x").unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        std::fs::write(root.join("outside/not-listed.txt"), "x").unwrap();
        std::os::unix::fs::symlink("../outside", root.join("a/link")).unwrap();
        let channel =
            testing::channel(Server::builder().add_service(FsServiceServer::new(Files::new(&ctx)))).await;
        let mut client = FsServiceClient::new(channel);

        let (dir_t, file_t, link_t) =
            (FileType::Directory as i32, FileType::File as i32, FileType::Symlink as i32);
        let one = listed(&mut client, 1).await;
        assert_eq!(one, [("a/b".into(), dir_t), ("a/link".into(), link_t), ("a/top.txt".into(), file_t)]);
        let two = listed(&mut client, 2).await;
        assert_eq!(
            two,
            [
                ("a/b".into(), dir_t),
                ("a/b/c".into(), dir_t),
                ("a/link".into(), link_t),
                ("a/top.txt".into(), file_t)
            ]
        );
        let all = listed(&mut client, 0).await;
        assert_eq!(all, one, "depth 0 lists one level");
        let deep = listed(&mut client, MAX_LIST_DEPTH + 5).await;
        assert_eq!(deep.len(), 5, "{deep:?}");
        assert!(deep.contains(&("a/b/c/deep.txt".into(), file_t)));
        assert!(deep.iter().all(|(p, _)| !p.contains("not-listed")), "{deep:?}");
    }
}

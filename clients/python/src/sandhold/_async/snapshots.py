"""Portable snapshots of a thread's workspace: save, list, fork, read an
artifact, delete."""

from __future__ import annotations

import builtins

from sandhold._async.rpc import AsyncRpc
from sandhold.models import Checkpoint, Fork
from sandhold.v1 import snapshot_pb2 as pb


class AsyncSnapshots:
    """``client.snapshots`` (the definition needs portable snapshots on)."""

    def __init__(self, rpc: AsyncRpc) -> None:
        self._rpc = rpc

    async def save(self, thread_id: str, *, run_id: str = "", label: str = "", sandbox_id: str = "") -> Checkpoint:
        """Save the thread's workspace as a checkpoint (after ``run_id``, when given)."""
        request = pb.SaveSnapshotRequest(thread_id=thread_id, run_id=run_id, label=label, sandbox_id=sandbox_id)
        r = await self._rpc.unary(self._rpc.snapshots.SaveSnapshot, request, pb.SaveSnapshotResponse)
        return Checkpoint.of(r.checkpoint)

    async def list(self, thread_id: str) -> builtins.list[Checkpoint]:
        request = pb.ListSnapshotsRequest(thread_id=thread_id)
        r = await self._rpc.unary(self._rpc.snapshots.ListSnapshots, request, pb.ListSnapshotsResponse)
        return [Checkpoint.of(c) for c in r.checkpoints]

    async def fork(self, thread_id: str, checkpoint_id: str, new_thread_id: str) -> Fork:
        """A new thread from a checkpoint: its next run's sandbox starts from
        the checkpoint's files, and it has copies of the runs before it."""
        request = pb.ForkSnapshotRequest(thread_id=thread_id, checkpoint_id=checkpoint_id, new_thread_id=new_thread_id)
        r = await self._rpc.unary(self._rpc.snapshots.ForkSnapshot, request, pb.ForkSnapshotResponse)
        return Fork(Checkpoint.of(r.checkpoint), builtins.list(r.run_ids))

    async def read_artifact(self, thread_id: str, checkpoint_id: str, path: str) -> bytes:
        """One file of a checkpoint."""
        request = pb.ReadArtifactRequest(thread_id=thread_id, checkpoint_id=checkpoint_id, path=path)
        parts = [r.data async for r in self._rpc.stream(self._rpc.snapshots.ReadArtifact, request, pb.ReadArtifactResponse)]
        return b"".join(parts)

    async def delete(self, thread_id: str, checkpoint_id: str) -> None:
        request = pb.DeleteSnapshotRequest(thread_id=thread_id, checkpoint_id=checkpoint_id)
        await self._rpc.unary(self._rpc.snapshots.DeleteSnapshot, request, pb.DeleteSnapshotResponse)

//! The request index in SQL, the same in SQLite and PostgreSQL: the rows the
//! fenced append writes in its transaction, and the reads that join them to
//! the chunks they point at.

use super::{IndexedRequest, Result, StoredChunk, sql::EventRow};

/// Columns of a request and its two chunks, `a` asked, `b` answered.
macro_rules! request_select {
    () => {
        "SELECT r.request_id, \
         a.seq AS a_seq, a.epoch AS a_epoch, a.kind AS a_kind, a.payload AS a_payload, \
         a.appended_at AS a_appended_at, \
         b.seq AS b_seq, b.epoch AS b_epoch, b.kind AS b_kind, b.payload AS b_payload, \
         b.appended_at AS b_appended_at \
         FROM run_requests r \
         JOIN run_events a ON a.tenant = r.tenant AND a.run_id = r.run_id AND a.seq = r.asked_seq \
         LEFT JOIN run_events b ON b.tenant = r.tenant AND b.run_id = r.run_id AND b.seq = r.answered_seq \
         WHERE r.tenant = $1 AND r.run_id = $2"
    };
}
pub(super) use request_select;

#[derive(sqlx::FromRow)]
pub(super) struct RequestRow {
    request_id: String,
    a_seq: i64,
    a_epoch: i64,
    a_kind: String,
    a_payload: Vec<u8>,
    a_appended_at: i64,
    b_seq: Option<i64>,
    b_epoch: Option<i64>,
    b_kind: Option<String>,
    b_payload: Option<Vec<u8>>,
    b_appended_at: Option<i64>,
}

impl RequestRow {
    pub(super) fn into_request(self) -> Result<IndexedRequest> {
        let asked = EventRow::new(self.a_seq, self.a_epoch, self.a_kind, self.a_payload, self.a_appended_at)
            .into_chunk()?;
        let answered: Option<StoredChunk> =
            match (self.b_seq, self.b_epoch, self.b_kind, self.b_payload, self.b_appended_at) {
                (Some(seq), Some(epoch), Some(kind), Some(payload), Some(at)) => {
                    Some(EventRow::new(seq, epoch, kind, payload, at).into_chunk()?)
                }
                _ => None,
            };
        Ok(IndexedRequest { request_id: self.request_id, asked, answered })
    }
}

/// Index the request marks of appended `$chunks`, stored at `$seqs` (in
/// order), inside the append's transaction `$tx`. The first ask of an id and
/// the first answer after it count, like a reader of the log keeps them.
macro_rules! index_requests {
    ($tx:expr, $run:expr, $chunks:expr, $seqs:expr) => {
        index_marks!(
            $tx,
            $run,
            $chunks.iter().zip($seqs).filter_map(|(chunk, seq)| Some((chunk.request.as_ref()?, seq)))
        )
    };
}

/// Index `$marks`, `(&RequestMark, seq)` in log order, inside `$tx`.
macro_rules! index_marks {
    ($tx:expr, $run:expr, $marks:expr) => {
        for (mark, seq) in $marks {
            let (statement, id) = match mark {
                $crate::store::RequestMark::Asked(id) => (
                    "INSERT INTO run_requests (tenant, run_id, request_id, asked_seq) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    id,
                ),
                $crate::store::RequestMark::Answered(id) => (
                    "UPDATE run_requests SET answered_seq = $4 \
                     WHERE tenant = $1 AND run_id = $2 AND request_id = $3 AND answered_seq IS NULL",
                    id,
                ),
            };
            sqlx::query(statement)
                .bind($run.tenant.as_str())
                .bind($run.run.as_str())
                .bind(id.as_str())
                .bind(seq)
                .execute(&mut *$tx)
                .await?;
        }
    };
}
pub(super) use index_marks;
pub(super) use index_requests;

/// The reads of the index ([`super::EventLog::requests`] and
/// [`super::EventLog::request`]) and its backfill
/// ([`super::EventLog::backfill_requests`]) for a backend struct with a
/// `pool` field. `$begin`: the statement opening a write transaction;
/// `$for_update`: the row-lock suffix that makes appends to the run wait
/// (they take its row `FOR SHARE` on PostgreSQL; SQLite has one writer).
macro_rules! impl_request_index {
    ($store:ty, begin: $begin:literal, for_update: $for_update:literal) => {
        impl $store {
            async fn backfill_request_index(
                &self,
                run: &RunKey,
                mark_of: &$crate::store::MarkOf,
            ) -> Result<bool> {
                const INDEXED: &str = "SELECT requests_indexed FROM runs WHERE tenant = $1 AND run_id = $2";
                let indexed: Option<bool> = sqlx::query_scalar(INDEXED)
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .fetch_optional(&self.pool)
                    .await?;
                if indexed != Some(false) {
                    return Ok(false);
                }
                let mut tx = self.pool.begin_with($begin).await?;
                let indexed: Option<bool> = sqlx::query_scalar(concat!(
                    "SELECT requests_indexed FROM runs WHERE tenant = $1 AND run_id = $2",
                    $for_update
                ))
                .bind(run.tenant.as_str())
                .bind(run.run.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                if indexed != Some(false) {
                    // Another reader built it meanwhile.
                    return Ok(false);
                }
                let mut marks = Vec::new();
                {
                    let mut rows = sqlx::query_as::<_, EventRow>(
                        "SELECT seq, epoch, kind, payload, appended_at FROM run_events \
                         WHERE tenant = $1 AND run_id = $2 ORDER BY seq",
                    )
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .fetch(&mut *tx);
                    while let Some(row) = futures::TryStreamExt::try_next(&mut rows).await? {
                        let chunk = row.into_chunk()?;
                        if let Some(mark) = mark_of(&chunk) {
                            marks.push((mark, chunk.offset.seq()));
                        }
                    }
                }
                // Rows of appends since the index existed may point at a
                // repeated ask rather than the first: rebuilt whole.
                sqlx::query("DELETE FROM run_requests WHERE tenant = $1 AND run_id = $2")
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .execute(&mut *tx)
                    .await?;
                index_marks!(tx, run, marks.iter().map(|(mark, seq)| (mark, *seq)));
                sqlx::query("UPDATE runs SET requests_indexed = TRUE WHERE tenant = $1 AND run_id = $2")
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(true)
            }

            async fn indexed_requests(
                &self,
                run: &RunKey,
                filter: $crate::store::RequestFilter,
            ) -> Result<Vec<$crate::store::IndexedRequest>> {
                let statement = match filter {
                    $crate::store::RequestFilter::All => concat!(request_select!(), " ORDER BY r.asked_seq"),
                    $crate::store::RequestFilter::Pending => {
                        concat!(request_select!(), " AND r.answered_seq IS NULL ORDER BY r.asked_seq")
                    }
                };
                sqlx::query_as::<_, RequestRow>(statement)
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(RequestRow::into_request)
                    .collect()
            }

            async fn indexed_request(
                &self,
                run: &RunKey,
                request_id: &str,
            ) -> Result<Option<$crate::store::IndexedRequest>> {
                sqlx::query_as::<_, RequestRow>(concat!(request_select!(), " AND r.request_id = $3"))
                    .bind(run.tenant.as_str())
                    .bind(run.run.as_str())
                    .bind(request_id)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(RequestRow::into_request)
                    .transpose()
            }
        }
    };
}
pub(super) use impl_request_index;

//! Merging journal batches that are already waiting, so the driver appends
//! them in one transaction.
//!
//! The agent sends the lines of each read of the journal as one `Follow`
//! message; a producer that flushes line by line makes many small messages.
//! The driver's cost is per append (one fenced transaction), so when it
//! falls behind it takes every `Lines` message already received in one go,
//! up to a bound. Nothing waits for more: a message that is not ready yet is
//! not waited for, so latency never grows, only the batch when there is a
//! backlog.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use shared::proto::agent::v1::{FollowResponse, follow_response};

/// A merged batch holds at most this many lines ...
pub const MAX_LINES: usize = 4096;
/// ... and at most about this many bytes of line data.
pub const MAX_BYTES: usize = 4 << 20;

/// `inner` with consecutive ready `Lines` messages merged into one.
pub struct Coalesced<S: Stream> {
    inner: S,
    /// What ended a merge and is delivered next (`None` inside: the end).
    held: Option<Option<S::Item>>,
}

impl<S: Stream> Coalesced<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, held: None }
    }
}

fn lines_of<E>(
    item: &mut Result<FollowResponse, E>,
) -> Option<&mut Vec<shared::proto::agent::v1::JournalLine>> {
    match item {
        Ok(FollowResponse { event: Some(follow_response::Event::Lines(lines)) }) => Some(&mut lines.lines),
        _ => None,
    }
}

impl<S, E> Stream for Coalesced<S>
where
    S: Stream<Item = Result<FollowResponse, E>> + Unpin,
    E: Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let mut first = match this.held.take() {
            Some(held) => return Poll::Ready(held),
            None => match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(item)) => item,
                other => return other,
            },
        };
        let Some(lines) = lines_of(&mut first) else { return Poll::Ready(Some(first)) };
        let mut bytes: usize = lines.iter().map(|l| l.data.len()).sum();
        while lines.len() < MAX_LINES && bytes < MAX_BYTES {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(mut next)) => match lines_of(&mut next) {
                    Some(more) => {
                        bytes += more.iter().map(|l| l.data.len()).sum::<usize>();
                        lines.append(more);
                    }
                    None => {
                        this.held = Some(Some(next));
                        break;
                    }
                },
                Poll::Ready(None) => {
                    this.held = Some(None);
                    break;
                }
            }
        }
        Poll::Ready(Some(first))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use shared::proto::agent::v1::{JournalLine, JournalLines, RunExit};

    use super::*;

    type Item = Result<FollowResponse, String>;

    fn lines(range: std::ops::Range<u64>) -> Item {
        let lines = range
            .map(|i| JournalLine {
                data: format!("l{i}").into_bytes(),
                end_offset: i + 1,
                sealed: false,
                stderr: false,
            })
            .collect();
        Ok(FollowResponse { event: Some(follow_response::Event::Lines(JournalLines { lines })) })
    }

    fn exit() -> Item {
        Ok(FollowResponse { event: Some(follow_response::Event::Exit(RunExit::default())) })
    }

    fn ends(item: &Item) -> Vec<u64> {
        match item {
            Ok(FollowResponse { event: Some(follow_response::Event::Lines(l)) }) => {
                l.lines.iter().map(|l| l.end_offset).collect()
            }
            _ => vec![],
        }
    }

    #[tokio::test]
    async fn ready_batches_merge_and_what_ends_them_comes_next_in_order() {
        let items =
            vec![lines(0..2), lines(2..3), lines(3..6), exit(), lines(6..7), Err("broke".to_string())];
        let out: Vec<Item> = Coalesced::new(futures::stream::iter(items)).collect().await;
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!(ends(&out[0]), (1..=6).collect::<Vec<_>>());
        assert!(matches!(&out[1], Ok(FollowResponse { event: Some(follow_response::Event::Exit(_)) })));
        assert_eq!(ends(&out[2]), [7]);
        assert_eq!(out[3], Err("broke".to_string()));
    }

    #[tokio::test]
    async fn nothing_waits_for_a_batch_that_is_not_there_yet() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Item>();
        let mut s = Coalesced::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        tx.send(lines(0..1)).unwrap();
        tx.send(lines(1..2)).unwrap();
        assert_eq!(ends(&s.next().await.unwrap()), [1, 2]);
        tx.send(lines(2..3)).unwrap();
        // Only what was ready: the next message is delivered alone.
        assert_eq!(ends(&s.next().await.unwrap()), [3]);
        drop(tx);
        assert!(s.next().await.is_none());
    }

    #[tokio::test]
    async fn a_merge_stops_at_its_bound() {
        let items: Vec<Item> = (0..3).map(|i| lines(i * 3000..(i + 1) * 3000)).collect();
        let out: Vec<Item> = Coalesced::new(futures::stream::iter(items)).collect().await;
        let sizes: Vec<usize> = out.iter().map(|i| ends(i).len()).collect();
        assert_eq!(sizes, [6000, 3000], "a merge takes whole messages until it holds {MAX_LINES} lines");
        assert_eq!(out.iter().flat_map(ends).collect::<Vec<_>>(), (1..=9000).collect::<Vec<_>>());
    }
}

//! Bounded capture of a command's output: at most a limit of stdout (past it
//! the rest is read and dropped, and the caller is told), and the last few KiB of
//! stderr. Reading stops when the caller says so, even if some escaped process
//! still holds the pipe open.

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

/// The most of a command's stdout that is kept.
pub(crate) const STDOUT_LIMIT: usize = 1 << 20;
/// How much of the end of a command's stderr is kept.
pub(crate) const STDERR_TAIL: usize = 4 << 10;

/// What was read from one pipe.
#[derive(Debug, Default)]
pub(crate) struct Captured {
    /// The bytes kept.
    pub(crate) bytes: Vec<u8>,
    /// Whether more came than was kept.
    pub(crate) overflow: bool,
}

/// How a pipe's bytes are kept.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Keep {
    /// The first `n` bytes; past them, `on_overflow` is cancelled.
    Head(usize),
    /// The last `n` bytes.
    Tail(usize),
}

/// Reads `pipe` until its end or until `done` is cancelled, keeping what `keep`
/// says.
pub(crate) async fn read(
    mut pipe: impl AsyncRead + Unpin,
    keep: Keep,
    on_overflow: CancellationToken,
    done: CancellationToken,
) -> Captured {
    let mut out = Captured::default();
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        let n = tokio::select! {
            r = pipe.read(&mut chunk) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = done.cancelled() => break,
        };
        let data = &chunk[..n];
        match keep {
            Keep::Head(limit) => {
                let room = limit.saturating_sub(out.bytes.len());
                out.bytes.extend_from_slice(&data[..room.min(n)]);
                if n > room && !out.overflow {
                    out.overflow = true;
                    on_overflow.cancel();
                }
            }
            Keep::Tail(limit) => {
                out.bytes.extend_from_slice(data);
                if out.bytes.len() > 2 * limit {
                    out.bytes.drain(..out.bytes.len() - limit);
                    out.overflow = true;
                }
            }
        }
    }
    if let Keep::Tail(limit) = keep {
        if out.bytes.len() > limit {
            out.bytes.drain(..out.bytes.len() - limit);
            out.overflow = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn capture(input: &[u8], keep: Keep) -> (Captured, bool) {
        let overflow = CancellationToken::new();
        let c = read(input, keep, overflow.clone(), CancellationToken::new()).await;
        (c, overflow.is_cancelled())
    }

    #[tokio::test]
    async fn head_stops_keeping_at_the_limit_and_says_so() {
        let (c, signalled) = capture(&[7u8; 100], Keep::Head(100)).await;
        assert_eq!((c.bytes.len(), c.overflow, signalled), (100, false, false));
        let big = vec![1u8; 50_000];
        let (c, signalled) = capture(&big, Keep::Head(20_000)).await;
        assert_eq!((c.bytes.len(), c.overflow, signalled), (20_000, true, true));
    }

    #[tokio::test]
    async fn tail_keeps_the_end() {
        let input: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (c, signalled) = capture(&input, Keep::Tail(4096)).await;
        assert_eq!(c.bytes, input[input.len() - 4096..]);
        assert!(c.overflow && !signalled);
        let (c, _) = capture(b"short", Keep::Tail(4096)).await;
        assert_eq!(c.bytes, b"short");
    }
}

//! The dashboard's connections, bounded: at most [`MAX_CONNECTIONS`] open at
//! once (the next waits in the kernel's backlog until one closes), and one
//! that moves no byte either way for [`IDLE`] is closed. The request layers
//! (`routes.rs`) bound requests; these bound what a client can hold open
//! without sending one, so a dashboard cannot be made to keep sockets and
//! memory for ever, on the host that also reaches the cluster's MongoDB.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 512;

/// A connection with no byte read or written for this long is closed (a live
/// tab's stream sends a keep-alive every 15 s, so it never idles this long).
pub(crate) const IDLE: Duration = Duration::from_secs(120);

/// A `TcpListener` whose connections are bounded in number and idle time.
#[derive(Debug)]
pub(crate) struct Bounded {
    listener: TcpListener,
    open: Arc<Semaphore>,
    idle: Duration,
}

impl Bounded {
    pub(crate) fn new(listener: TcpListener, max: usize, idle: Duration) -> Self {
        Bounded { listener, open: Arc::new(Semaphore::new(max)), idle }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Conn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Conn, std::net::SocketAddr) {
        // Not accepted until a connection closes: the kernel's backlog holds
        // (and then refuses) the rest.
        let Ok(permit) = self.open.clone().acquire_owned().await else {
            // The semaphore is never closed; should it be, stop accepting.
            return std::future::pending().await;
        };
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let idle = Box::pin(tokio::time::sleep(self.idle));
                    return (Conn { stream, _permit: permit, idle, every: self.idle }, addr);
                }
                Err(e) => {
                    // Out of descriptors, say: wait, as axum's own listener does.
                    tracing::warn!(error = %e, "the dashboard could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

/// The peer's address of a connection, as the audit log records it (through
/// `into_make_service_with_connect_info::<Peer>()`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) std::net::SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Bounded>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Bounded>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// One accepted connection: its slot among [`MAX_CONNECTIONS`], and its idle
/// deadline, moved on by every byte read or written.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Pin<Box<Sleep>>,
    every: Duration,
}

impl Conn {
    /// Moves the idle deadline on after progress; an error once it passed.
    fn check(&mut self, cx: &mut Context<'_>, progressed: bool) -> io::Result<()> {
        if progressed {
            let next = Instant::now() + self.every;
            self.idle.as_mut().reset(next);
            return Ok(());
        }
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::TimedOut, "the connection was idle too long")),
            Poll::Pending => Ok(()),
        }
    }
}

use std::future::Future as _;

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let progressed = matches!(polled, Poll::Ready(_)) && buf.filled().len() > before;
        if let Err(e) = self.check(cx, progressed) {
            return Poll::Ready(Err(e));
        }
        polled
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, data);
        let progressed = matches!(polled, Poll::Ready(Ok(n)) if n > 0);
        if let Err(e) = self.check(cx, progressed) {
            return Poll::Ready(Err(e));
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The cap holds connections past it in the backlog until one closes,
    /// and an idle connection is closed: before, a client could hold any
    /// number of sockets open for ever without sending a request.
    #[tokio::test]
    async fn connections_are_bounded_in_number_and_idle_time() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut bounded = Bounded::new(tcp, 2, Duration::from_millis(300));
        let (_a, _b) = (TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap());
        let (mut first, _) = bounded.accept().await;
        let (_second, _) = bounded.accept().await;
        let _c = TcpStream::connect(addr).await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(200), bounded.accept()).await;
        assert!(third.is_err(), "a third connection was accepted over a cap of two");
        // Idle: the first connection's read ends with an error once idle.
        let mut buf = [0_u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(5), first.read(&mut buf)).await.unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::TimedOut);
        drop(first);
        let (mut third, _) = tokio::time::timeout(Duration::from_secs(5), bounded.accept()).await.unwrap();
        // Progress keeps a connection open past the idle time.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            third.write_all(b"x").await.unwrap();
        }
    }
}

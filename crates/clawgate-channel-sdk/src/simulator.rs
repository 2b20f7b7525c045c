//! Building blocks for channel simulators: a TCP listener whose connections a request handler
//! can cut, so the server acts but its answer never arrives (a "lost answer" fault).
//!
//! Serve an axum router over a [`CuttableListener`] with
//! `into_make_service_with_connect_info::<Connection>()`; a handler that extracts
//! `ConnectInfo<Connection>` calls [`Connection::cut`] after acting, and the client sees the
//! connection drop instead of the response.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener whose connections can be cut from inside a request handler.
///
/// Accepted streams get `TCP_NODELAY`; an accept error is retried after 20 ms.
#[derive(Debug)]
pub struct CuttableListener(TcpListener);

impl CuttableListener {
    /// Wraps a bound listener.
    pub fn new(listener: TcpListener) -> Self {
        CuttableListener(listener)
    }
}

impl axum::serve::Listener for CuttableListener {
    type Io = CuttableStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let cut = Arc::new(AtomicBool::new(false));
                    return (CuttableStream { stream, cut }, addr);
                }
                // Out of descriptors and the like: wait a little, as axum's own listener does.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection accepted by a [`CuttableListener`].
///
/// Once cut, reads see end-of-stream and writes and flushes fail with `ConnectionAborted`:
/// hyper drops the connection without writing the answer, as a connection lost after the
/// server acted. Shutdown passes through.
#[derive(Debug)]
pub struct CuttableStream {
    stream: TcpStream,
    cut: Arc<AtomicBool>,
}

impl AsyncRead for CuttableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.cut.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CuttableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.cut.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.cut.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The per-connection handle a handler gets as `ConnectInfo<Connection>`, to cut its own
/// connection.
#[derive(Clone, Debug)]
pub struct Connection {
    cut: Arc<AtomicBool>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, CuttableListener>>
    for Connection
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, CuttableListener>) -> Self {
        Connection {
            cut: stream.io().cut.clone(),
        }
    }
}

impl Connection {
    /// Cuts the connection: the answer being written is never sent.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

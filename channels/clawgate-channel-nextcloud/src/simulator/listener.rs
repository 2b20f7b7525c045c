//! A TCP listener whose connections a request handler can cut: the answer is never written, as
//! a connection lost after the server acted.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

pub(crate) struct CuttableListener(pub(crate) TcpListener);

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
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// Once cut, reads see end-of-stream and writes fail: hyper drops the connection without
/// writing the answer.
pub(crate) struct CuttableStream {
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

/// The per-connection handle a handler uses to cut its own connection.
#[derive(Clone)]
pub(crate) struct Connection {
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
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

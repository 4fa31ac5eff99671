// gpulb's patch: a write buffer that holds memory only while it holds bytes.

//! A write buffer like tokio's [`BufWriter`](tokio::io::BufWriter) whose allocation lives only
//! while bytes wait in it: it is made by the first small write and given back once a flush has
//! written everything out. tokio's buffer is allocated at creation and kept for the stream's
//! life, so every open client connection held `DEFAULT_L4_WRITE_BUFFER_SIZE` bytes (1,460),
//! even a token stream that is silent between one flushed event and the next.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[derive(Debug)]
pub(crate) struct LazyBufWriter<W> {
    inner: W,
    /// The bytes waiting to be written; no allocation while empty.
    buf: Vec<u8>,
    /// How many bytes a write may leave in `buf`; 0 writes straight through.
    capacity: usize,
    /// How many of `buf`'s bytes a flush in progress has written.
    written: usize,
}

impl<W: AsyncWrite + Unpin> LazyBufWriter<W> {
    pub(crate) fn with_capacity(capacity: usize, inner: W) -> Self {
        LazyBufWriter {
            inner,
            buf: Vec::new(),
            capacity,
            written: 0,
        }
    }

    pub(crate) fn get_ref(&self) -> &W {
        &self.inner
    }

    pub(crate) fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The inner stream; bytes still buffered are lost.
    pub(crate) fn into_inner(self) -> W {
        self.inner
    }

    /// Writes out what is buffered, then gives the buffer's memory back.
    fn flush_buf(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut ret = Ok(());
        while self.written < self.buf.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..])) {
                Ok(0) => {
                    ret = Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "failed to write the buffered data",
                    ));
                    break;
                }
                Ok(n) => self.written += n,
                Err(e) => {
                    ret = Err(e);
                    break;
                }
            }
        }
        if self.written == self.buf.len() {
            self.buf = Vec::new();
        } else if self.written > 0 {
            self.buf.drain(..self.written);
        }
        self.written = 0;
        Poll::Ready(ret)
    }

    fn buffer(&mut self, bytes: &[u8]) {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.capacity);
        }
        self.buf.extend_from_slice(bytes);
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for LazyBufWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.buf.len() + buf.len() > this.capacity {
            ready!(this.flush_buf(cx))?;
        }
        if buf.len() >= this.capacity {
            Pin::new(&mut this.inner).poll_write(cx, buf)
        } else {
            this.buffer(buf);
            Poll::Ready(Ok(buf.len()))
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total = bufs
            .iter()
            .fold(0usize, |sum, b| sum.saturating_add(b.len()));
        if this.buf.len().saturating_add(total) > this.capacity {
            ready!(this.flush_buf(cx))?;
        }
        if total >= this.capacity {
            if this.inner.is_write_vectored() {
                return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
            }
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return Pin::new(&mut this.inner).poll_write(cx, first);
        }
        for b in bufs {
            this.buffer(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_buf(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_buf(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<W: AsyncRead + Unpin> AsyncRead for LazyBufWriter<W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn small_writes_wait_in_a_buffer_that_is_freed_once_flushed() {
        let mut writer = LazyBufWriter::with_capacity(16, Vec::new());
        assert_eq!(writer.buf.capacity(), 0, "nothing allocated before a write");
        writer.write_all(b"head ").await.unwrap();
        writer.write_all(b"body").await.unwrap();
        assert!(
            writer.get_ref().is_empty(),
            "small writes wait for the flush"
        );
        assert!(writer.buf.capacity() >= 16);
        writer.flush().await.unwrap();
        assert_eq!(writer.get_ref().as_slice(), b"head body");
        assert_eq!(
            writer.buf.capacity(),
            0,
            "the buffer is given back once flushed"
        );
    }

    #[tokio::test]
    async fn a_write_that_would_overflow_flushes_first_and_a_large_one_goes_straight_through() {
        let mut writer = LazyBufWriter::with_capacity(8, Vec::new());
        writer.write_all(b"abc").await.unwrap();
        writer.write_all(b"0123456789").await.unwrap();
        assert_eq!(writer.get_ref().as_slice(), b"abc0123456789", "in order");
        assert_eq!(writer.buf.capacity(), 0, "nothing buffered, nothing held");
        let written = writer
            .write_vectored(&[IoSlice::new(b"x"), IoSlice::new(b"y")])
            .await
            .unwrap();
        assert_eq!(written, 2, "small vectored writes are buffered whole");
        writer.shutdown().await.unwrap();
        assert_eq!(writer.get_ref().as_slice(), b"abc0123456789xy");
    }

    #[tokio::test]
    async fn a_zero_capacity_writes_straight_through() {
        let mut writer = LazyBufWriter::with_capacity(0, Vec::new());
        writer.write_all(b"a").await.unwrap();
        assert_eq!(writer.get_ref().as_slice(), b"a");
        assert_eq!(writer.buf.capacity(), 0);
    }
}

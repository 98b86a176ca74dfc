//! User-space TLS, for kernels without kTLS (or ciphers the kernel does not take).
//!
//! The write path keeps each body byte to one copy: a batch of up to
//! [`RECORDS_PER_WRITE`] records is laid out in a reused buffer, one `preadv` reads
//! the file straight into the records' payload slots, each record is sealed in
//! place, and one `write` sends the batch. A head sent with `more` is held back and
//! becomes the start of the first record's payload, so head and body share a record
//! as they share a segment on the plain path. Batch buffers come from a per-worker
//! pool ([`RecordBuffers`]): no allocation per request once the pool is warm.
//!
//! The read path opens records in a per-connection buffer ([`crate::tls::inbound`])
//! and hands the plaintext to the HTTP layer. Alerts end the stream (close_notify)
//! or the connection; a TLS 1.3 KeyUpdate switches the receive key, and if the peer
//! asks, a KeyUpdate of ours goes out before the next application data, followed by
//! our new key.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsFd;
use std::rc::Rc;

use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::socket::{Pace, SendLimits};
use super::{socket, SendError, Transport};
use crate::tls::control::{self, KEY_UPDATE_NOT_REQUESTED};
use crate::tls::handshake::Established;
use crate::tls::inbound::Inbound;
use crate::tls::record::{self, Opener, Protocol, Sealer, MAX_PAYLOAD};

/// Records sealed per `write`: 16 full records is 256 KiB of file data per syscall.
pub const RECORDS_PER_WRITE: usize = 16;
/// Largest record this side produces (TLS 1.2 AES-GCM has the most overhead).
const MAX_RECORD: usize = MAX_PAYLOAD + 29;
/// A batch buffer: the records plus room for one KeyUpdate record in front.
const BATCH_BYTES: usize = RECORDS_PER_WRITE * MAX_RECORD + 64;
/// Idle batch buffers a worker keeps.
const POOL_MAX: usize = 256;

/// A worker's pool of batch buffers, shared by its user-space TLS connections.
#[derive(Default)]
pub struct RecordBuffers {
    free: RefCell<Vec<Vec<u8>>>,
}

impl RecordBuffers {
    fn take(&self) -> Vec<u8> {
        self.free.borrow_mut().pop().unwrap_or_else(|| vec![0; BATCH_BYTES])
    }

    /// A batch buffer with every page written, so that it exists in memory (first
    /// touch decides its node), for the worker to keep in its pool.
    pub fn warm_one(&self) -> Vec<u8> {
        let mut b = self.take();
        for page in b.chunks_mut(4096) {
            page[0] = 1;
        }
        b
    }

    pub fn give_back(&self, buf: Vec<u8>) {
        self.give(buf);
    }

    fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.borrow_mut();
        if free.len() < POOL_MAX {
            free.push(buf);
        }
    }
}

pub struct UserTls {
    stream: TcpStream,
    pace: Pace,
    sealer: Sealer,
    /// The receiving side: records read but not yet opened, close_notify, and
    /// whether the peer asked for our key to change.
    inbound: Inbound,
    kernel: KernelConnection<ServerConnectionData>,
    protocol: Protocol,
    /// Before sealing a batch at or past this sequence number, renew the key (TLS
    /// 1.3) or refuse (TLS 1.2, which cannot renew).
    rekey_at: u64,
    /// Plaintext held back by `write_all(.., more = true)`.
    held: Vec<u8>,
    buffers: Rc<RecordBuffers>,
    /// Sealed records the socket has not taken yet; written before anything else.
    pending: Vec<u8>,
    body_bytes: u64,
}

impl UserTls {
    pub fn new(stream: TcpStream, est: Established, limits: SendLimits, buffers: Rc<RecordBuffers>) -> UserTls {
        let limit = est.record_limit();
        UserTls {
            stream,
            pace: Pace::new(limits),
            sealer: Sealer::new(est.protocol, &est.secrets.tx.1, est.secrets.tx.0),
            inbound: Inbound::new(Opener::new(est.protocol, &est.secrets.rx.1, est.secrets.rx.0)),
            kernel: est.kernel,
            protocol: est.protocol,
            rekey_at: limit.saturating_sub(2 * RECORDS_PER_WRITE as u64 + 2),
            held: Vec::new(),
            buffers,
            pending: Vec::new(),
            body_bytes: 0,
        }
    }

    /// Opens every complete record received, appending application data to `buf`;
    /// a KeyUpdate takes the peer's next key from rustls's key schedule.
    fn open_records(&mut self, buf: &mut Vec<u8>) -> Result<usize, control::Violation> {
        let kernel = &mut self.kernel;
        self.inbound.open_records(buf, &mut |opener| {
            let (seq, secrets) = kernel.update_rx_secret()?;
            opener.rekey(&secrets, seq);
            Ok(())
        })
    }

    /// Starts a batch: if our key must change first, seals a KeyUpdate record at
    /// the front of `batch` and switches keys. Returns where the data records start.
    fn start_batch(&mut self, batch: &mut [u8]) -> Result<usize, SendError> {
        let renew = self.inbound.key_update_due() || self.sealer.seq() >= self.rekey_at;
        if !renew {
            return Ok(0);
        }
        if self.protocol == Protocol::Tls12 {
            return Err(SendError::Io(io::Error::other("TLS 1.2 record limit for this key reached")));
        }
        let off = self.sealer.payload_offset();
        batch[off..off + KEY_UPDATE_NOT_REQUESTED.len()].copy_from_slice(&KEY_UPDATE_NOT_REQUESTED);
        let n = self.sealer.seal(record::CONTENT_HANDSHAKE, batch, KEY_UPDATE_NOT_REQUESTED.len());
        let (seq, secrets) = self.kernel.update_tx_secret().map_err(|e| SendError::Io(io::Error::other(e)))?;
        self.sealer.rekey(&secrets, seq);
        self.inbound.key_update_sent();
        Ok(n)
    }

    /// Seals `payload_total` bytes already placed in the payload slots of records
    /// at `start`, `start + stride`, ...; returns the end of the last record.
    fn seal_batch(&mut self, batch: &mut [u8], start: usize, mut payload_total: usize) -> usize {
        let stride = MAX_PAYLOAD + self.sealer.overhead();
        let mut pos = start;
        while payload_total > 0 {
            let n = payload_total.min(MAX_PAYLOAD);
            pos += self.sealer.seal(record::CONTENT_APPLICATION_DATA, &mut batch[pos..pos + stride], n);
            payload_total -= n;
        }
        pos
    }

    /// Seals an alert and sends it if the socket takes it at once (the connection
    /// is about to close).
    fn send_alert(&mut self, alert: [u8; 2]) {
        if !self.pending.is_empty() {
            // Sealed records are still queued ahead of it; the alert cannot overtake them.
            return;
        }
        let mut rec = [0u8; 64];
        let off = self.sealer.payload_offset();
        rec[off..off + 2].copy_from_slice(&alert);
        let n = self.sealer.seal(record::CONTENT_ALERT, &mut rec, 2);
        let _ = self.stream.try_write(&rec[..n]);
    }

    /// Writes what the socket takes of `bytes` now, without waiting, and keeps the
    /// rest in `pending`.
    fn write_now(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        let mut done = 0;
        while done < bytes.len() {
            match self.stream.try_write(&bytes[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.pending.extend_from_slice(&bytes[done..]);
        Ok(())
    }

    /// Waits until every pending record is written, then frees their copy.
    async fn flush_pending(&mut self) -> Result<(), SendError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        self.write_out(&pending).await
    }

    /// How many full records the next batch holds: what the socket has room for
    /// now, at least one and at most [`RECORDS_PER_WRITE`].
    fn batch_records(&self, stride: usize) -> usize {
        match linerate_sys::tcp::send_room(self.stream.as_fd()) {
            Ok(room) => (room / stride).clamp(1, RECORDS_PER_WRITE),
            Err(_) => RECORDS_PER_WRITE,
        }
    }

    /// Reads up to `records` payload slots' worth of `file` at `offset` (at most
    /// `len` bytes) into `batch`, after the held head bytes, and seals it. Returns
    /// the batch's end and the file bytes read.
    fn seal_from_file(
        &mut self,
        batch: &mut [u8],
        file: &File,
        offset: u64,
        len: u64,
        records: usize,
    ) -> Result<(usize, usize), SendError> {
        let off = self.sealer.payload_offset();
        let stride = MAX_PAYLOAD + self.sealer.overhead();
        let start = self.start_batch(batch)?;
        let held = self.held.len();
        batch[start + off..start + off + held].copy_from_slice(&self.held);
        self.held.clear();
        // One iovec per record payload slot (the first after the held bytes),
        // covering at most `len` bytes.
        let mut want = len;
        let mut count = 0;
        let mut chunks = batch[start..].chunks_mut(stride);
        let mut slices: [IoSliceMut<'_>; RECORDS_PER_WRITE] = std::array::from_fn(|i| {
            let from = off + if i == 0 { held } else { 0 };
            match chunks.next() {
                Some(rec) if i < records && want > 0 && rec.len() >= off + MAX_PAYLOAD => {
                    let n = ((off + MAX_PAYLOAD - from) as u64).min(want) as usize;
                    want -= n as u64;
                    count += 1;
                    IoSliceMut::new(&mut rec[from..from + n])
                }
                _ => IoSliceMut::new(Default::default()),
            }
        });
        let read = linerate_sys::preadv(file.as_fd(), &mut slices[..count], offset)?;
        if read == 0 {
            return Err(SendError::Truncated);
        }
        Ok((self.seal_batch(batch, start, held + read), read))
    }

    /// Fills up to [`RECORDS_PER_WRITE`] payload slots of `batch` from `sources`, in
    /// order (advancing them), and seals them. Returns the batch's end.
    fn seal_from_slices(&mut self, batch: &mut [u8], sources: &mut [&[u8]; 2]) -> Result<usize, SendError> {
        let off = self.sealer.payload_offset();
        let stride = MAX_PAYLOAD + self.sealer.overhead();
        let start = self.start_batch(batch)?;
        let mut pos = start;
        let mut total = 0;
        for _ in 0..RECORDS_PER_WRITE {
            let mut filled = 0;
            for src in sources.iter_mut() {
                let n = src.len().min(MAX_PAYLOAD - filled);
                batch[pos + off + filled..pos + off + filled + n].copy_from_slice(&src[..n]);
                *src = &src[n..];
                filled += n;
            }
            if filled == 0 {
                break;
            }
            total += filled;
            pos += stride;
        }
        Ok(self.seal_batch(batch, start, total))
    }

    async fn write_out(&self, mut bytes: &[u8]) -> Result<(), SendError> {
        while !bytes.is_empty() {
            match self.stream.try_write(bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    socket::wait_writable(&self.stream, &self.pace, self.body_bytes).await?
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Transport for UserTls {
    const KIND: crate::counters::TransportKind = crate::counters::TransportKind::UserTls;

    async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        loop {
            let n = match self.open_records(buf) {
                Ok(n) => n,
                Err(v) => {
                    if let Some(alert) = v.alert {
                        self.send_alert(alert);
                    }
                    return Err(v.error);
                }
            };
            if n > 0 {
                return Ok(n);
            }
            if self.inbound.peer_closed() {
                return Ok(0);
            }
            let rx = self.inbound.rx();
            if rx.capacity() - rx.len() < 2048 {
                rx.reserve(8192);
            }
            if self.stream.read_buf(rx).await? == 0 {
                return Ok(0);
            }
        }
    }

    async fn write_all(&mut self, bytes: &[u8], more: bool) -> Result<(), SendError> {
        if more {
            self.held.extend_from_slice(bytes);
            return Ok(());
        }
        let mut held = std::mem::take(&mut self.held);
        let mut sources = [held.as_slice(), bytes];
        let result = async {
            while sources.iter().any(|s| !s.is_empty()) {
                self.flush_pending().await?;
                let mut batch = self.buffers.take();
                let sealed =
                    self.seal_from_slices(&mut batch, &mut sources).and_then(|end| self.write_now(&batch[..end]));
                self.buffers.give(batch);
                sealed?;
            }
            self.flush_pending().await
        }
        .await;
        held.clear();
        self.held = held;
        result
    }

    async fn send_file(&mut self, file: &File, mut offset: u64, mut len: u64) -> Result<(), SendError> {
        if self.held.len() > MAX_PAYLOAD / 2 {
            // Too much held back to share the first record: send it on its own.
            self.write_all(&[], false).await?;
        }
        let stride = MAX_PAYLOAD + self.sealer.overhead();
        while len > 0 {
            self.flush_pending().await?;
            let records = self.batch_records(stride);
            let mut batch = self.buffers.take();
            let result = self.seal_from_file(&mut batch, file, offset, len, records).and_then(|(end, read)| {
                self.write_now(&batch[..end])?;
                Ok(read)
            });
            self.buffers.give(batch);
            let read = result?;
            offset += read as u64;
            len -= read as u64;
            self.body_bytes += read as u64;
        }
        self.flush_pending().await
    }

    fn begin_response(&mut self) {
        self.pace.begin(self.body_bytes);
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body_bytes
    }

    fn wants_close(&self) -> bool {
        // TLS 1.3 renews its key; TLS 1.2 cannot, so it closes well before the limit.
        self.protocol == Protocol::Tls12 && self.sealer.seq() >= self.rekey_at - self.rekey_at / 8
    }

    async fn close(mut self, linger: bool) {
        self.send_alert(control::CLOSE_NOTIFY);
        socket::close(self.stream, linger).await
    }
}

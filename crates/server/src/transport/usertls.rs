//! User-space TLS, for kernels without kTLS (or ciphers the kernel does not take).
//!
//! The write path keeps each body byte to one copy: a batch of up to
//! [`RECORDS_PER_WRITE`] records is laid out in a reused buffer, one `preadv` reads
//! the file straight into the records' payload slots, each record is sealed in
//! place, and one `write` sends the batch. A head sent with `more` is held back and
//! becomes the start of the first record's payload, so head and body share a record
//! as they share a segment on the plain path. Batch buffers come from a per-worker
//! pool ([`RecordBuffers`]): no allocation per request once the pool is warm.
//! A socket that takes only part of a batch leaves the connection holding at most
//! the unsent tail of one record; the records after it are dropped unsent and
//! sealed again later (`send_batch`).
//!
//! The read path opens records in a per-connection buffer ([`crate::tls::inbound`])
//! that exists only while a record is arriving (an idle connection holds none) and
//! hands the plaintext to the HTTP layer. Alerts end the stream (close_notify) or
//! the connection; a TLS 1.3 KeyUpdate switches the receive key, and if the peer
//! asks, a KeyUpdate of ours goes out before the next application data, followed by
//! our new key.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsFd;
use std::rc::Rc;

use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::socket::{Pace, SendLimits};
use super::{socket, SendError, Transport};
use crate::tls::control::{self, KEY_UPDATE_NOT_REQUESTED};
use crate::tls::handshake::Established;
use crate::tls::inbound::Inbound;
use crate::tls::record::{self, Opener, Protocol, Sealer, MAX_PAYLOAD};

/// Records sealed per `write`: 16 full records is 256 KiB of file data per syscall.
pub(crate) const RECORDS_PER_WRITE: usize = 16;
/// Largest record this side produces (TLS 1.2 AES-GCM has the most overhead).
const MAX_RECORD: usize = MAX_PAYLOAD + 29;
/// A batch buffer: the records plus room for one KeyUpdate record in front.
const BATCH_BYTES: usize = RECORDS_PER_WRITE * MAX_RECORD + 64;
/// Idle batch buffers a worker keeps.
const POOL_MAX: usize = 256;
/// Receive buffer for a record whose header has not arrived: a request in one record.
const RX_FIRST_READ_BYTES: usize = 2048;

/// A worker's pool of batch buffers, shared by its user-space TLS connections.
#[derive(Default)]
pub(crate) struct RecordBuffers {
    free: RefCell<Vec<Vec<u8>>>,
}

impl RecordBuffers {
    fn take(&self) -> Vec<u8> {
        self.free.borrow_mut().pop().unwrap_or_else(|| vec![0; BATCH_BYTES])
    }

    /// A batch buffer with every page written, so that it exists in memory (first
    /// touch decides its node), for the worker to keep in its pool.
    pub(crate) fn warm_one(&self) -> Vec<u8> {
        let mut b = self.take();
        for page in b.chunks_mut(4096) {
            page[0] = 1;
        }
        b
    }

    pub(crate) fn give_back(&self, buf: Vec<u8>) {
        self.give(buf);
    }

    fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.borrow_mut();
        if free.len() < POOL_MAX {
            free.push(buf);
        }
    }
}

pub(crate) struct UserTls {
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
    /// Sealed bytes the socket has not taken yet (at most the tail of one record,
    /// see `send_batch`); written before anything else.
    pending: Vec<u8>,
    /// How many records the next file batch may hold.
    sizer: BatchSizer,
    /// The socket took all of the last file batch.
    last_taken_whole: bool,
    body_bytes: u64,
    /// Records sealed, then dropped unsent (see `send_batch`).
    #[cfg(test)]
    dropped_records: u64,
}

/// How many records a connection's next file batch may hold, learnt from what its
/// socket takes. `send_room` is exact while TCP memory is plentiful; under memory
/// pressure or `TCP_NOTSENT_LOWAT` the socket takes less, and every record it
/// refuses is sealed twice (see `UserTls::send_batch`). So after a partial write
/// the cap is what that write took, and it is raised by one record at a time, each
/// raise after a run of batches taken whole with room left; a raise the socket
/// refuses doubles the run required before the next (up to 64), so a socket that
/// never takes more costs a few dropped records, not one every other batch.
struct BatchSizer {
    cap: usize,
    /// Batches to see taken whole, with room left, before the next raise.
    probe_after: u32,
    streak: u32,
    /// The cap was just raised: the next batch tells whether that was too much.
    probing: bool,
}

const MAX_PROBE_AFTER: u32 = 64;

impl BatchSizer {
    fn new() -> BatchSizer {
        BatchSizer { cap: RECORDS_PER_WRITE, probe_after: 1, streak: 0, probing: false }
    }

    /// Whether a partial write has limited the batches.
    fn limited(&self) -> bool {
        self.cap < RECORDS_PER_WRITE
    }

    /// The socket took the last batch whole, or only `records` whole records of it.
    fn taken(&mut self, whole: bool, records: usize) {
        if whole {
            if self.probing {
                self.probe_after = (self.probe_after / 2).max(1);
            }
        } else {
            if self.probing {
                self.probe_after = (self.probe_after * 2).min(MAX_PROBE_AFTER);
            }
            self.streak = 0;
            self.cap = records.clamp(1, RECORDS_PER_WRITE);
        }
        self.probing = false;
    }

    /// After a batch taken whole, the socket still has room.
    fn room_after_whole(&mut self) {
        self.streak += 1;
        if self.streak >= self.probe_after && self.cap < RECORDS_PER_WRITE {
            self.cap += 1;
            self.streak = 0;
            self.probing = true;
        }
    }
}

/// A batch of records sealed from a file by `seal_from_file`.
struct FileBatch {
    /// Where the data records start (after a KeyUpdate record, if one leads).
    start: usize,
    /// Where the last record ends.
    end: usize,
    /// Data records in the batch.
    records: usize,
    /// Held head bytes at the front of the first record's payload.
    held: usize,
    /// File bytes in the batch.
    read: usize,
}

impl UserTls {
    pub(crate) fn new(stream: TcpStream, est: Established, limits: SendLimits, buffers: Rc<RecordBuffers>) -> UserTls {
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
            sizer: BatchSizer::new(),
            last_taken_whole: true,
            body_bytes: 0,
            #[cfg(test)]
            dropped_records: 0,
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
    /// `len` bytes) into `batch`, after the held head bytes, and seals it. The held
    /// bytes stay in `held` until `send_batch` knows their record is kept.
    fn seal_from_file(
        &mut self,
        batch: &mut [u8],
        file: &File,
        offset: u64,
        len: u64,
        records: usize,
    ) -> Result<FileBatch, SendError> {
        let off = self.sealer.payload_offset();
        let stride = MAX_PAYLOAD + self.sealer.overhead();
        let start = self.start_batch(batch)?;
        let held = self.held.len();
        batch[start + off..start + off + held].copy_from_slice(&self.held);
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
        let end = self.seal_batch(batch, start, held + read);
        Ok(FileBatch { start, end, records: (held + read).div_ceil(MAX_PAYLOAD), held, read })
    }

    /// Writes what the socket takes of a file batch now, without waiting, and
    /// returns the file bytes that are sent or pending.
    ///
    /// A socket that takes only part of the batch (full, or short of TCP memory: then
    /// it takes less than `send_room` promised) keeps the record it stopped in: its
    /// unsent tail goes to `pending`. The records after it never reached the socket,
    /// so they are dropped, and the sealer's sequence number goes back by as many:
    /// the same file bytes are read and sealed again when the socket has room. This
    /// reuses those records' nonces, which is safe because their ciphertext was
    /// never written anywhere a peer could see it. A stalled viewer thus holds less
    /// than one record, where keeping the whole remainder held up to a batch
    /// (256 KiB). The next batch is then no larger than what the socket took, so
    /// little sealing is thrown away.
    fn send_batch(&mut self, batch: &[u8], b: &FileBatch) -> Result<usize, SendError> {
        let stride = MAX_PAYLOAD + self.sealer.overhead();
        let mut done = 0;
        while done < b.end {
            match self.stream.try_write(&batch[done..b.end]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Data records the socket took at least a byte of (a KeyUpdate record in
        // front is always kept: the sealer has switched keys after it).
        let kept = if done <= b.start { 0 } else { ((done - b.start - 1) / stride + 1).min(b.records) };
        let kept_end = if kept == b.records { b.end } else { b.start + kept * stride };
        self.pending.extend_from_slice(&batch[done..kept_end]);
        self.sealer.rewind((b.records - kept) as u64);
        #[cfg(test)]
        {
            self.dropped_records += (b.records - kept) as u64;
        }
        // After a partial write, offer what this one took (`send_file` offers more
        // once the socket shows room beyond a batch taken whole).
        self.last_taken_whole = kept == b.records;
        self.sizer.taken(self.last_taken_whole, done.saturating_sub(b.start) / stride);
        if kept == 0 {
            return Ok(0);
        }
        self.held.clear();
        Ok(if kept == b.records { b.read } else { kept * MAX_PAYLOAD - b.held })
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
            // Room is made once bytes are there, and only as much as the record
            // being received needs: an idle connection holds no receive buffer.
            self.stream.readable().await?;
            let want = self.inbound.read_size(RX_FIRST_READ_BYTES);
            let rx = self.inbound.rx();
            rx.reserve(want);
            match socket::read_available(&self.stream, rx) {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
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
            if self.sizer.limited() {
                // The socket has been taking batches only in part. Is there room now
                // (the kernel's own test)? If the last batch went whole and there is
                // still room, the sizer may offer more; if there is none, wait rather
                // than seal records the socket would refuse (clearing the runtime's
                // stale readiness first, so that the wait is real).
                if linerate_sys::tcp::is_writable(self.stream.as_fd())? {
                    if self.last_taken_whole {
                        self.sizer.room_after_whole();
                    }
                } else {
                    let _ = self.stream.try_io(Interest::WRITABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
                    socket::wait_writable(&self.stream, &self.pace, self.body_bytes).await?;
                }
            }
            let records = self.batch_records(stride).min(self.sizer.cap);
            let mut batch = self.buffers.take();
            let result =
                self.seal_from_file(&mut batch, file, offset, len, records).and_then(|b| self.send_batch(&batch, &b));
            self.buffers.give(batch);
            let sent = result?;
            if sent == 0 && self.pending.is_empty() {
                // The socket took nothing: wait for room before sealing again.
                socket::wait_writable(&self.stream, &self.pace, self.body_bytes).await?;
            }
            offset += sent as u64;
            len -= sent as u64;
            self.body_bytes += sent as u64;
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

    async fn close(&mut self, linger: bool) {
        self.send_alert(control::CLOSE_NOTIFY);
        socket::close(&mut self.stream, linger).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::handshake;
    use crate::tls::testing::{configs, ALL_SUITES};
    use std::io::{Read, Write};
    use std::time::Duration;

    #[test]
    fn batch_sizer_backs_off_raises_the_socket_refuses() {
        let mut s = BatchSizer::new();
        assert!(!s.limited());
        s.taken(false, 3);
        assert_eq!(s.cap, 3);
        // A socket that takes one record per write, however much room it shows:
        // every raise to two is refused, and raises come ever more rarely.
        s.taken(false, 1);
        let mut raises = 0;
        for _ in 0..1000 {
            s.room_after_whole();
            if s.cap == 2 {
                raises += 1;
                s.taken(false, 1);
            } else {
                s.taken(true, 1);
            }
        }
        assert!((5..=25).contains(&raises), "{raises} refused raises in 1000 batches");
        // A socket with room again: the cap climbs back to a full batch.
        for _ in 0..100 {
            s.room_after_whole();
            s.taken(true, s.cap);
        }
        assert_eq!(s.cap, RECORDS_PER_WRITE);
        assert!(!s.limited());
    }

    /// A client reading slowly through a small receive buffer, and a socket that
    /// takes less than its free buffer space, make many batches go out only in part.
    /// The records dropped unsent and sealed again must still make one intact
    /// stream, for every suite (TLS 1.2 AES-GCM also carries the sequence number in
    /// each record's explicit nonce).
    #[test]
    fn batches_taken_in_part_are_resealed_into_an_intact_stream() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let path = dir.path().join("f");
        std::fs::write(&path, &data).unwrap();
        for &(suite, _) in ALL_SUITES {
            let (server_config, client_config) = configs(suite);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                sock.set_recv_buffer_size(16 * 1024).unwrap();
                sock.connect(&addr.into()).unwrap();
                let sock: std::net::TcpStream = sock.into();
                sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let conn = rustls::ClientConnection::new(client_config, "localhost".try_into().unwrap()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, sock);
                tls.flush().unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    match tls.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                        Err(e) => panic!("client read: {e}"),
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                got
            });
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let dropped = rt.block_on(async {
                let (sock, _) = listener.accept().unwrap();
                sock.set_nonblocking(true).unwrap();
                // The socket stops taking bytes once 16 KiB are unsent, well before
                // its buffer is full (SO_SNDBUF minus SIOCOUTQ), as under TCP memory
                // pressure or with `tcp.notsent_lowat_bytes`.
                linerate_sys::tcp::set_notsent_lowat(sock.as_fd(), 16 * 1024).unwrap();
                let mut stream = TcpStream::from_std(sock).unwrap();
                let est = handshake::accept(&mut stream, server_config).await.unwrap();
                let limits =
                    SendLimits { timeout: Duration::from_secs(20), min_rate: 0, min_rate_after: Duration::ZERO };
                let mut t = UserTls::new(stream, est, limits, Rc::new(RecordBuffers::default()));
                let file = File::open(&path).unwrap();
                t.write_all(b"head:", true).await.unwrap();
                t.send_file(&file, 0, data.len() as u64).await.unwrap();
                t.close(false).await;
                t.dropped_records
            });
            let got = client.join().unwrap();
            assert_eq!(&got[..5], b"head:", "{suite:?}");
            assert!(got[5..] == data[..], "{suite:?}: {} bytes arrived, other than sent", got.len() - 5);
            println!("{suite:?}: {dropped} records dropped and sealed again");
            assert!(dropped > 0, "{suite:?}: no batch was taken in part, so this run proves nothing");
        }
    }
}

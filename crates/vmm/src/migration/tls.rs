//! TLS 1.3 on the migration stream (rustls, ring), both sides
//! authenticated by certificates in the manner of QEMU's tls-creds-x509
//! with verify-peer: a directory holding `ca-cert.pem`, and
//! `server-cert.pem` + `server-key.pem` (the destination) or
//! `client-cert.pem` + `client-key.pem` (the source). Each side verifies
//! the other's chain against the CA; the source also checks that the
//! destination's certificate names the host it dialled (or `tls-name=`).
//!
//! After the handshake a pump thread owns the rustls connection and the
//! TCP socket and relays plaintext to a local socket pair (`link` says
//! why). No pre-shared-key mode: rustls has no external PSKs, and this is
//! no place to build TLS key schedules by hand.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};

use super::link::{Link, Stream};

/// How long a handshake may take: a peer that connects and says nothing
/// holds the destination's accept loop no longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Plaintext the pump holds for the local side before it stops reading
/// the network (back-pressure, as a TCP socket's receive buffer).
const PENDING_LIMIT: usize = 1 << 20;
/// The pump's read size on either side.
const CHUNK: usize = 64 << 10;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `DIR/NAME`'s certificates, one line on failure.
fn certificates(dir: &Path, name: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let path = dir.join(name);
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("tls={}: {name}: {}", dir.display(), pem_reason(e)))?;
    if certs.is_empty() {
        return Err(format!(
            "tls={}: {name} holds no certificate",
            dir.display()
        ));
    }
    Ok(certs)
}

fn private_key(dir: &Path, name: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(dir.join(name))
        .map_err(|e| format!("tls={}: {name}: {}", dir.display(), pem_reason(e)))
}

fn pem_reason(e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(e) => api::io_reason(&e),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind in it".into(),
        other => other.to_string(),
    }
}

fn roots(dir: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(dir, "ca-cert.pem")? {
        roots
            .add(cert)
            .map_err(|e| format!("tls={}: ca-cert.pem: {e}", dir.display()))?;
    }
    Ok(Arc::new(roots))
}

/// The destination's credentials: its certificate and key, and the CA
/// every source's certificate must chain to.
#[derive(Clone)]
pub struct TlsServer(Arc<ServerConfig>);

impl TlsServer {
    pub fn load(dir: &Path) -> Result<TlsServer, String> {
        let bad = |e: &dyn std::fmt::Display| format!("tls={}: {e}", dir.display());
        let provider = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(dir)?, provider.clone())
            .build()
            .map_err(|e| bad(&e))?;
        let config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                certificates(dir, "server-cert.pem")?,
                private_key(dir, "server-key.pem")?,
            )
            .map_err(|e| bad(&format!("server-cert.pem/server-key.pem: {e}")))?;
        // No session resumption: every connection shows its certificate.
        let mut config = config;
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(TlsServer(Arc::new(config)))
    }

    pub(super) fn connection(&self) -> Result<Connection, String> {
        rustls::ServerConnection::new(self.0.clone())
            .map(Connection::Server)
            .map_err(|e| format!("TLS: {e}"))
    }
}

/// The source's credentials, and the name the destination must carry.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl TlsClient {
    pub fn load(dir: &Path, server_name: &str) -> Result<TlsClient, String> {
        let bad = |e: &dyn std::fmt::Display| format!("tls={}: {e}", dir.display());
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| format!("'{server_name}' is not a host name or address to verify"))?;
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| bad(&e))?
            .with_root_certificates(roots(dir)?)
            .with_client_auth_cert(
                certificates(dir, "client-cert.pem")?,
                private_key(dir, "client-key.pem")?,
            )
            .map_err(|e| bad(&format!("client-cert.pem/client-key.pem: {e}")))?;
        let mut config = config;
        config.resumption = rustls::client::Resumption::disabled();
        Ok(TlsClient {
            config: Arc::new(config),
            name,
        })
    }

    pub(super) fn connection(&self) -> Result<Connection, String> {
        ClientConnection::new(self.config.clone(), self.name.clone())
            .map(Connection::Client)
            .map_err(|e| format!("TLS: {e}"))
    }
}

/// Runs the handshake on `tcp` (at most HANDSHAKE_TIMEOUT), then hands
/// the connection to a pump thread; returns the link whose stream is the
/// local end. One line on failure: what the handshake found.
pub(super) fn start(mut tcp: TcpStream, mut conn: Connection) -> Result<Link, String> {
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).ok();
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).ok();
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return Err(handshake_reason(&e));
        }
    }
    // The client's last flight may still be buffered.
    while conn.wants_write() {
        conn.write_tls(&mut tcp).map_err(|e| handshake_reason(&e))?;
    }
    let identity = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.as_ref().to_vec());
    tcp.set_read_timeout(None).ok();
    tcp.set_write_timeout(None).ok();
    let network = Stream::from(tcp.try_clone().map_err(|e| e.to_string())?);
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    let failure = Arc::new(Mutex::new(None));
    let pump = Pump {
        conn,
        tcp,
        local: theirs,
        failure: failure.clone(),
    };
    std::thread::Builder::new()
        .name("migrate-tls".into())
        .spawn(move || pump.run())
        .map_err(|e| format!("cannot start the TLS thread: {e}"))?;
    Ok(Link::relayed(
        Stream::from(ours),
        network,
        identity,
        failure,
    ))
}

fn handshake_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => "TLS handshake: the peer closed the connection".into(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "TLS handshake: nothing from the peer for {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        ),
        io::ErrorKind::InvalidData => format!(
            "TLS handshake: {}",
            e.get_ref()
                .map_or_else(|| e.to_string(), |inner| inner.to_string())
        ),
        _ => format!("TLS handshake: {}", api::io_reason(e)),
    }
}

/// Relays between the TLS connection on the network and the plaintext
/// local socket, both non-blocking, waiting in poll(2) for whichever side
/// can move. Each direction ends on its own (the local side's end sends
/// close_notify; the network's end shuts the local side's writing), so
/// the migration code sees the ends and errors a TCP socket would show.
struct Pump {
    conn: Connection,
    tcp: TcpStream,
    local: UnixStream,
    /// Why it stopped, for the link (recorded before the local side sees
    /// the end, so whoever reads that end finds the reason).
    failure: Arc<Mutex<Option<String>>>,
}

impl Pump {
    fn run(mut self) {
        // Started on the destination before the VM's threads are
        // filtered (the first connection), its own filter covers it too.
        sandbox::enter_or_exit(sandbox::ThreadKind::MigrateTls);
        if let Err(why) = self.relay() {
            tracing::debug!("migration TLS pump: {why}");
            *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            let _ = self.local.shutdown(Shutdown::Both);
        }
        let _ = self.tcp.shutdown(Shutdown::Both);
    }

    fn relay(&mut self) -> Result<(), String> {
        self.tcp
            .set_nonblocking(true)
            .and_then(|()| self.local.set_nonblocking(true))
            .map_err(|e| e.to_string())?;
        let mut to_local: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; CHUNK];
        // The handshake may have read and decrypted records that came
        // right behind the peer's last flight (a source's hello follows
        // its Finished at once): their plaintext waits in `conn`, and no
        // readable socket would ever tell of it.
        let mut network_open = self.take_plaintext(&mut to_local, false);
        let (mut local_open, mut local_shut) = (true, false);
        loop {
            // Move what is ready to move.
            while self.conn.wants_write() {
                match self.conn.write_tls(&mut self.tcp) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(format!("network: {}", api::io_reason(&e))),
                }
            }
            while !to_local.is_empty() {
                match self.local.write(&to_local) {
                    Ok(n) => {
                        to_local.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The migration code closed its end: nobody reads.
                    Err(_) => to_local.clear(),
                }
            }
            if !network_open && to_local.is_empty() && !local_shut {
                let _ = self.local.shutdown(Shutdown::Write);
                local_shut = true;
            }
            if !network_open && !local_open && !self.conn.wants_write() {
                return Ok(());
            }

            let mut fds = [
                poll_fd(
                    self.tcp.as_raw_fd(),
                    network_open && to_local.len() < PENDING_LIMIT,
                    self.conn.wants_write(),
                ),
                poll_fd(
                    self.local.as_raw_fd(),
                    local_open && !self.conn.wants_write(),
                    !to_local.is_empty(),
                ),
            ];
            // SAFETY: `fds` is an array of two initialized pollfd values
            // that outlives the call; its length is passed with it.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("poll: {e}"));
            }

            if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && network_open
            {
                network_open = self.receive_records(&mut to_local)?;
            }
            if fds[1].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && local_open {
                match self.local.read(&mut buf) {
                    Ok(0) => {
                        local_open = false;
                        self.conn.send_close_notify();
                    }
                    Ok(n) => self
                        .conn
                        .writer()
                        .write_all(&buf[..n])
                        .map_err(|e| format!("TLS: {e}"))?,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => {
                        local_open = false;
                        self.conn.send_close_notify();
                    }
                }
            }
        }
    }

    /// Reads records from the network into `to_local`; false once the
    /// peer has closed (cleanly or not).
    fn receive_records(&mut self, to_local: &mut Vec<u8>) -> Result<bool, String> {
        let eof = match self.conn.read_tls(&mut self.tcp) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(format!("network: {}", api::io_reason(&e))),
        };
        if let Err(e) = self.conn.process_new_packets() {
            // Tell the peer why (best effort), then end.
            let _ = self.conn.write_tls(&mut self.tcp);
            return Err(format!("TLS: {e}"));
        }
        Ok(self.take_plaintext(to_local, eof))
    }

    /// Moves the plaintext `conn` holds into `to_local`; false once the
    /// peer has closed (close_notify, or `eof`: the network ended).
    fn take_plaintext(&mut self, to_local: &mut Vec<u8>, eof: bool) -> bool {
        let mut chunk = [0u8; 16 << 10];
        loop {
            match self.conn.reader().read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => to_local.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return !eof,
                // The network ended without close_notify: a drop.
                Err(_) => return false,
            }
        }
    }
}

/// A pollfd for `fd` waiting for `read` and/or `write`; neither: ignored
/// (fd -1), so a hung-up side we no longer use does not wake poll again
/// and again.
fn poll_fd(fd: i32, read: bool, write: bool) -> libc::pollfd {
    let mut events = 0;
    if read {
        events |= libc::POLLIN;
    }
    if write {
        events |= libc::POLLOUT;
    }
    libc::pollfd {
        fd: if events == 0 { -1 } else { fd },
        events,
        revents: 0,
    }
}

/// Throwaway credentials for tests, the unit tests' and the guest tests'
/// alike (feature `test-credentials`): a CA of its own and the
/// destination's (for 127.0.0.1) and the source's certificates signed by
/// it, under the names `tls=DIR` reads, in a new directory under the
/// temporary one; `DIR/sibling` is another source of the same CA. Not for
/// real use: the keys are written as they are.
#[cfg(any(test, feature = "test-credentials"))]
pub fn test_credentials(name: &str) -> std::path::PathBuf {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hk-tls-test-{}-{n}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name
        .push(DnType::CommonName, format!("hakoniwa test CA {name}"));
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca-cert.pem"), ca.pem()).unwrap();
    // `sibling/` holds a second source certificate from the same CA, with
    // the same name: a peer the CA vouches for that is not this source.
    let sibling = dir.join("sibling");
    std::fs::create_dir_all(&sibling).unwrap();
    std::fs::write(sibling.join("ca-cert.pem"), ca.pem()).unwrap();
    for (role, purpose, into) in [
        ("server", ExtendedKeyUsagePurpose::ServerAuth, &dir),
        ("client", ExtendedKeyUsagePurpose::ClientAuth, &dir),
        ("client", ExtendedKeyUsagePurpose::ClientAuth, &sibling),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.extended_key_usages = vec![purpose];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("hakoniwa test {role}"));
        let cert = params.signed_by(&key, &*ca).unwrap();
        std::fs::write(into.join(format!("{role}-cert.pem")), cert.pem()).unwrap();
        std::fs::write(into.join(format!("{role}-key.pem")), key.serialize_pem()).unwrap();
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::super::address::MigrationAuth;
    use super::super::link::Auth;
    use super::*;
    use std::net::TcpListener;

    fn tls(dir: &Path) -> MigrationAuth {
        MigrationAuth::Tls {
            dir: dir.to_path_buf(),
            name: None,
        }
    }

    /// A destination on a loopback port taking one connection through
    /// `auth`; the result of its handshake comes back on the handle.
    fn serve_once(auth: Auth) -> (u16, std::thread::JoinHandle<Result<Link, String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            auth.open(tcp)
        });
        (port, server)
    }

    #[test]
    fn a_mutual_handshake_carries_bytes_both_ways_and_names_the_source() {
        let dir = test_credentials("good");
        let (port, server) = serve_once(Auth::destination(&tls(&dir)).unwrap());
        let client = Auth::source(&tls(&dir), "127.0.0.1").unwrap();
        let link = client
            .open(TcpStream::connect(("127.0.0.1", port)).unwrap())
            .unwrap();
        let theirs = server.join().unwrap().unwrap();
        // The destination knows the source by its certificate.
        let client_der = CertificateDer::from_pem_file(dir.join("client-cert.pem")).unwrap();
        assert_eq!(theirs.peer_identity.as_deref(), Some(client_der.as_ref()));

        // More than one record and more than the pump's pending limit,
        // both ways at once, from a second thread on each side.
        let big: Vec<u8> = (0..3 * PENDING_LIMIT)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let sent = big.clone();
        let mut writer = link.stream.try_clone().unwrap();
        let push = std::thread::spawn(move || writer.write_all(&sent).unwrap());
        let mut back = theirs.stream.try_clone().unwrap();
        let echo = std::thread::spawn(move || back.write_all(b"welcome").unwrap());
        let mut got = vec![0u8; big.len()];
        (&theirs.stream).read_exact(&mut got).unwrap();
        assert!(got == big, "the bytes changed on the way");
        let mut answer = [0u8; 7];
        (&link.stream).read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"welcome");
        push.join().unwrap();
        echo.join().unwrap();

        // Closing one side is an end of stream at the other.
        link.shutdown();
        let mut rest = Vec::new();
        (&theirs.stream).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert!(theirs.tls_failure().reason().is_none());
    }

    /// A source's first bytes can arrive with its last handshake flight,
    /// and the destination's handshake then reads and decrypts them. Here
    /// the destination finishes its handshake by hand and takes records
    /// until the source's bytes wait in the connection as plaintext, with
    /// nothing more to come from the network, then hands it to the pump:
    /// the bytes must still come out of the link.
    #[test]
    fn plaintext_read_with_the_handshake_reaches_the_link() {
        let dir = test_credentials("early");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = Auth::source(&tls(&dir), "127.0.0.1").unwrap();
        let source = std::thread::spawn(move || {
            let link = client
                .open(TcpStream::connect(("127.0.0.1", port)).unwrap())
                .unwrap();
            (&link.stream).write_all(b"hello").unwrap();
            // Silent from here on, until the echo.
            let mut echo = [0u8; 5];
            (&link.stream).read_exact(&mut echo).unwrap();
            echo
        });
        let (mut tcp, _) = listener.accept().unwrap();
        let mut conn = TlsServer::load(&dir).unwrap().connection().unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).unwrap();
        }
        while conn.wants_write() {
            conn.write_tls(&mut tcp).unwrap();
        }
        while conn
            .process_new_packets()
            .unwrap()
            .plaintext_bytes_to_read()
            < 5
        {
            conn.read_tls(&mut tcp).unwrap();
        }
        let link = start(tcp, conn).unwrap();
        link.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut got = [0u8; 5];
        (&link.stream)
            .read_exact(&mut got)
            .expect("the bytes read with the handshake never reached the link");
        assert_eq!(&got, b"hello");
        (&link.stream).write_all(&got).unwrap();
        assert_eq!(&source.join().unwrap(), b"hello");
    }

    /// Runs one client against a TLS destination; returns the
    /// destination's error.
    fn refused(client: impl FnOnce(u16, &Path) + Send + 'static) -> String {
        let dir = test_credentials("dst");
        let (port, server) = serve_once(Auth::destination(&tls(&dir)).unwrap());
        let peer = std::thread::spawn(move || client(port, &dir));
        let err = match server.join().unwrap() {
            Ok(_) => panic!("the destination took a peer it should not"),
            Err(e) => e,
        };
        peer.join().unwrap();
        assert!(!err.contains('\n'), "{err}");
        err
    }

    #[test]
    fn peers_that_are_not_authenticated_sources_fail_the_handshake_in_one_line() {
        // A bare connect and close (`nc -z`).
        let err = refused(|port, _| drop(TcpStream::connect(("127.0.0.1", port)).unwrap()));
        assert!(err.contains("closed"), "{err}");

        // A plain-TCP source (auth=none) sending its hello.
        let err = refused(|port, _| {
            let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let hello = super::super::protocol::Message::Hello(b"{}".to_vec());
            super::super::protocol::write_message(&mut tcp, &hello).unwrap();
            let _ = tcp.read(&mut [0u8; 64]);
        });
        assert!(err.starts_with("TLS handshake: "), "{err}");

        // A source whose certificate comes from another CA: refused, and
        // it learns so from the alert, not as a closed connection.
        let stranger = test_credentials("stranger");
        let err = refused(move |port, ours| {
            // It trusts our CA; its own certificate is from another.
            std::fs::copy(ours.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();
            let client = Auth::source(&tls(&stranger), "127.0.0.1").unwrap();
            let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
            // TLS 1.3: the client's handshake ends before the server has
            // checked its certificate, or fails on the server's.
            if let Ok(link) = client.open(tcp) {
                let n = (&link.stream).read(&mut [0u8; 16]).unwrap_or(0);
                assert_eq!(n, 0);
                let why = link.tls_failure().reason().unwrap_or_default();
                assert!(why.contains("alert"), "{why}");
            }
        });
        assert!(err.contains("invalid peer certificate"), "{err}");

        // A TLS client with no certificate at all.
        let err = refused(|port, _| {
            let dir = test_credentials("anon");
            let mut roots = RootCertStore::empty();
            for cert in certificates(&dir, "ca-cert.pem").unwrap() {
                roots.add(cert).unwrap();
            }
            let config = ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let conn = ClientConnection::new(Arc::new(config), name).unwrap();
            let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let _ = start(tcp, Connection::Client(conn));
        });
        assert!(err.contains("TLS handshake"), "{err}");
    }

    #[test]
    fn the_source_checks_the_destination_certificate_and_name() {
        // Another CA's destination.
        let dir = test_credentials("src");
        let other = test_credentials("other");
        let (port, server) = serve_once(Auth::destination(&tls(&other)).unwrap());
        let client = Auth::source(&tls(&dir), "127.0.0.1").unwrap();
        let err = client
            .open(TcpStream::connect(("127.0.0.1", port)).unwrap())
            .err()
            .expect("a destination of another CA was taken");
        assert!(err.contains("invalid peer certificate"), "{err}");
        assert!(server.join().unwrap().is_err());
        // The right CA, but not the name asked for.
        let (port, server) = serve_once(Auth::destination(&tls(&dir)).unwrap());
        let client = Auth::source(&tls(&dir), "dst.example").unwrap();
        let err = client
            .open(TcpStream::connect(("127.0.0.1", port)).unwrap())
            .err()
            .expect("a destination of another name was taken");
        assert!(err.contains("not valid for name"), "{err}");
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn missing_or_broken_credentials_are_one_line_errors_naming_the_file() {
        let dir = test_credentials("partial");
        std::fs::remove_file(dir.join("server-key.pem")).unwrap();
        let err = TlsServer::load(&dir).err().unwrap();
        assert!(err.contains("server-key.pem"), "{err}");
        std::fs::write(dir.join("ca-cert.pem"), "not a certificate").unwrap();
        let err = TlsClient::load(&dir, "127.0.0.1").err().unwrap();
        assert!(err.contains("ca-cert.pem"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

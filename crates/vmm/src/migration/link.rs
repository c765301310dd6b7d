//! The migration connection as the rest of the migration code sees it: a
//! plain, cloneable byte stream (`Stream`), whether it is the TCP socket
//! itself (`auth=none`) or one end of a socket pair whose other end a TLS
//! pump thread relays to and from the network (`tls=`, `migration::tls`).
//!
//! Why a pump and not the rustls connection in the migration code: the
//! stream is read and written by different threads at once (postcopy:
//! page requests flow back while pages flow forward; the source reads
//! requests on a thread of its own), and a rustls connection is one value
//! that cannot be cloned. One thread that owns it and the TCP socket, and
//! relays plaintext over a local socket pair, keeps every reader and
//! writer as it was (blocking reads with timeouts, `try_clone`, shutdown)
//! for one more copy of each byte, which the migration benchmark's TLS
//! rows measure. A connection shared behind a lock would need every
//! reader and writer turned non-blocking.

use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};

use super::address::MigrationAuth;
use super::tls::{self, TlsClient, TlsServer};
use super::MigrationError;

/// The migration code's byte stream: TCP, or the local end of a TLS pump.
pub type Stream = socket2::Socket;

/// How this side authenticates connections, credentials loaded.
#[derive(Clone)]
pub enum Auth {
    None,
    Server(TlsServer),
    Client(TlsClient),
}

impl Auth {
    /// Loads the destination's credentials (`--incoming ...,tls=DIR`).
    pub fn destination(auth: &MigrationAuth) -> Result<Auth, String> {
        match auth {
            MigrationAuth::None => Ok(Auth::None),
            MigrationAuth::Tls { dir, .. } => Ok(Auth::Server(TlsServer::load(dir)?)),
        }
    }

    /// Loads the source's credentials (`ctl migrate --to ...,tls=DIR`);
    /// `server_name`: what the destination's certificate must carry.
    pub fn source(auth: &MigrationAuth, server_name: &str) -> Result<Auth, String> {
        match auth {
            MigrationAuth::None => Ok(Auth::None),
            MigrationAuth::Tls { dir, .. } => Ok(Auth::Client(TlsClient::load(dir, server_name)?)),
        }
    }

    /// How a source's `--to` for this destination ends, for messages
    /// (the credentials directory is the source's own).
    pub fn address_suffix(&self) -> &'static str {
        match self {
            Auth::None => ",auth=none",
            Auth::Server(_) | Auth::Client(_) => ",tls=DIR",
        }
    }

    /// Whether a peer that passes this is authenticated (TLS), so it may
    /// be told how its VM differs from ours.
    pub fn authenticates(&self) -> bool {
        !matches!(self, Auth::None)
    }

    /// Makes a link of a connected (or accepted) TCP socket: plain, or
    /// after a TLS handshake that authenticated both sides. One line on
    /// failure.
    pub fn open(&self, tcp: TcpStream) -> Result<Link, String> {
        tcp.set_nodelay(true).ok();
        match self {
            Auth::None => Link::plain(tcp),
            Auth::Server(server) => tls::start(tcp, server.connection()?),
            Auth::Client(client) => tls::start(tcp, client.connection()?),
        }
    }
}

/// One migration connection.
pub struct Link {
    /// What the migration code reads and writes.
    pub stream: Stream,
    /// The TCP socket itself, for its options (send buffer).
    network: Stream,
    /// The peer's certificate (DER of its end-entity certificate), after
    /// a TLS handshake: a postcopy resume must come from the same one.
    pub peer_identity: Option<Vec<u8>>,
    /// Why the TLS pump stopped, once it has.
    failure: TlsFailure,
}

/// Why a TLS link's pump stopped (an alert from the peer, a record that
/// failed to authenticate), readable after the link was given away.
/// Always `None` on a plain link.
#[derive(Clone, Default)]
pub struct TlsFailure(Option<Arc<Mutex<Option<String>>>>);

impl TlsFailure {
    pub fn reason(&self) -> Option<String> {
        self.0
            .as_ref()
            .and_then(|f| f.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// A stream error caused by the TLS layer ending the connection shows
    /// as an end of the stream; this says why it ended instead.
    pub fn explain(&self, e: MigrationError) -> MigrationError {
        match (&e, self.reason()) {
            // The pump's own reasons begin with "TLS"; the network's not.
            (MigrationError::Stream(_), Some(why)) if why.starts_with("TLS") => {
                MigrationError::Invalid(why)
            }
            (MigrationError::Stream(_), Some(why)) => {
                MigrationError::Invalid(format!("TLS connection: {why}"))
            }
            _ => e,
        }
    }
}

impl Link {
    fn plain(tcp: TcpStream) -> Result<Link, String> {
        let stream = Stream::from(tcp);
        let network = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(Link {
            stream,
            network,
            peer_identity: None,
            failure: TlsFailure::default(),
        })
    }

    pub(super) fn relayed(
        stream: Stream,
        network: Stream,
        peer_identity: Option<Vec<u8>>,
        failure: Arc<Mutex<Option<String>>>,
    ) -> Link {
        Link {
            stream,
            network,
            peer_identity,
            failure: TlsFailure(Some(failure)),
        }
    }

    /// Sets SO_SNDBUF of both the stream and the network socket (best
    /// effort): what can queue in front of a demanded postcopy page.
    pub fn set_send_buffer(&self, bytes: usize) {
        for socket in [&self.stream, &self.network] {
            if let Err(e) = socket.set_send_buffer_size(bytes) {
                tracing::warn!("SO_SNDBUF: {e}");
            }
        }
    }

    /// A second handle to the network socket (for its options).
    pub fn network(&self) -> std::io::Result<Stream> {
        self.network.try_clone()
    }

    /// Why the TLS layer ended the connection (an alert from the peer, a
    /// record that failed to decrypt), if it did: a better reason than
    /// the end of the stream it shows as. The handle outlives the link.
    pub fn tls_failure(&self) -> TlsFailure {
        self.failure.clone()
    }

    /// Ends the connection both ways.
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

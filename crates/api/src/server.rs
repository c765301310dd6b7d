//! The API server: a Unix socket listener on a background thread that turns
//! HTTP requests into [`ApiAction`](crate::ApiAction)s for a [`VmController`].
//!
//! Design constraints, all because this runs inside the VMM process:
//! - plain `std` threads, no async runtime, so the VMM's own threading is not
//!   affected;
//! - every read and write has a deadline and connections are capped, so a
//!   slow, stuck or malicious client can tie up at most a few threads for a
//!   few seconds and never the VMM itself;
//! - no input can panic the server, and a panicking controller costs one
//!   request (answered with 500), not the server.

use std::cell::Cell;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::action::{ApiError, ApiResponse, ErrorBody, VmController};
use crate::endpoints::{self, Lookup};
use crate::http::{Connection, Limits, ReadError, Request, Response};
use crate::Error;

/// Tunables of the server. The defaults suit an interactive control socket;
/// tests shorten the timeout to exercise it quickly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// How long a client may take to send one complete request (and to read
    /// the response). Also the idle timeout of keep-alive connections.
    pub request_timeout: Duration,
    /// Largest accepted request body; larger ones get 413 without being
    /// read, so a client cannot make the VMM buffer arbitrary amounts.
    pub max_body_bytes: usize,
    /// Largest accepted request head (request line plus headers); 431 above.
    pub max_header_bytes: usize,
    /// Connections served at once; more get 503 immediately. Bounds the
    /// threads a misbehaving client can make the VMM spawn.
    pub max_connections: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            max_body_bytes: 64 * 1024,
            max_header_bytes: 16 * 1024,
            max_connections: 16,
        }
    }
}

/// Epoll token of the listening socket.
const LISTENER_TOKEN: u64 = 0;
/// Epoll token of the stop eventfd.
const STOP_TOKEN: u64 = 1;

/// A running API server. Dropping it (or calling [`ApiServer::stop`]) stops
/// accepting connections and removes the socket file, so a VMM that exits
/// normally leaves nothing behind for the next run to trip over.
#[derive(Debug)]
pub struct ApiServer {
    path: PathBuf,
    /// Device and inode of the socket file we created, so we never delete a
    /// file someone else put at the same path after us.
    file_id: (u64, u64),
    stopping: Arc<AtomicBool>,
    stop_evt: EventFd,
    thread: Option<JoinHandle<()>>,
    /// Requests read and not yet answered, so a stop can let them finish.
    in_flight: Arc<InFlight>,
    /// How long a stop waits for them: one request timeout to write the
    /// answer, and as long again for the VMM to have decided it.
    answer_deadline: Duration,
    removed: bool,
}

impl ApiServer {
    /// Binds `path` and serves the API on it from a background thread with
    /// the default [`ServerOptions`].
    ///
    /// Fails (without touching the file) if `path` is a socket some process
    /// is listening on, or if it exists and is not a socket. A socket file
    /// nobody listens on any more (left by a crashed VMM) is replaced.
    pub fn start(path: &Path, controller: Arc<dyn VmController>) -> Result<ApiServer, Error> {
        Self::start_with_options(path, controller, ServerOptions::default())
    }

    /// [`ApiServer::start`] with explicit tunables.
    pub fn start_with_options(
        path: &Path,
        controller: Arc<dyn VmController>,
        options: ServerOptions,
    ) -> Result<ApiServer, Error> {
        clear_stale_socket(path)?;
        let socket_err = |error| Error::Socket {
            path: path.to_owned(),
            error,
        };
        let listener = UnixListener::bind(path).map_err(socket_err)?;
        // From here on the file is ours; remove it if setup fails.
        let setup = || -> io::Result<((u64, u64), Epoll, EventFd)> {
            // The API can stop the VM: only the owner may connect.
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
            let meta = fs::symlink_metadata(path)?;
            listener.set_nonblocking(true)?;
            let epoll = Epoll::new()?;
            let stop_evt = EventFd::new(0)?;
            epoll.ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER_TOKEN),
            )?;
            epoll.ctl(
                ControlOperation::Add,
                stop_evt.as_raw_fd(),
                EpollEvent::new(EventSet::IN, STOP_TOKEN),
            )?;
            Ok(((meta.dev(), meta.ino()), epoll, stop_evt))
        };
        let (file_id, epoll, stop_evt) = match setup() {
            Ok(v) => v,
            Err(e) => {
                let _ = fs::remove_file(path);
                return Err(socket_err(e));
            }
        };

        let stopping = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(InFlight::default());
        let ctx = AcceptLoop {
            listener,
            epoll,
            controller,
            options,
            stopping: stopping.clone(),
            active: Arc::new(AtomicUsize::new(0)),
            in_flight: in_flight.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("api-server".into())
            .spawn(move || {
                sandbox::enter_or_exit(sandbox::ThreadKind::ApiServer);
                ctx.run()
            });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = fs::remove_file(path);
                return Err(Error::Server(e));
            }
        };
        Ok(ApiServer {
            path: path.to_owned(),
            file_id,
            stopping,
            stop_evt,
            thread: Some(thread),
            in_flight,
            answer_deadline: options.request_timeout * 2,
            removed: false,
        })
    }

    /// The socket path being served.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting connections, waits for the accept thread and for the
    /// answers to requests already read (bounded by twice the request
    /// timeout), and removes the socket file. Those connections are not kept
    /// alive; idle ones and requests read later get 503.
    ///
    /// Waiting matters because a VMM exits right after this: an action that
    /// ends the VM (`shutdown`) is acted on before its answer is written, and
    /// an exit in between would leave the client without one.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stopping.store(true, Ordering::SeqCst);
            // Wakes the accept loop's epoll_wait; it then sees `stopping`.
            if self.stop_evt.write(1).is_ok() {
                let _ = thread.join();
            }
            self.in_flight.wait_idle(self.answer_deadline);
        }
        if !self.removed {
            self.removed = true;
            if let Ok(meta) = fs::symlink_metadata(&self.path) {
                if (meta.dev(), meta.ino()) == self.file_id {
                    let _ = fs::remove_file(&self.path);
                }
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Makes `path` free for binding, or explains why it must not be.
fn clear_stale_socket(path: &Path) -> Result<(), Error> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(Error::Socket {
                path: path.to_owned(),
                error,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket(path.to_owned()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(Error::SocketInUse(path.to_owned())),
        // Nobody listens: a leftover from a process that died.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            fs::remove_file(path).map_err(|error| Error::Socket {
                path: path.to_owned(),
                error,
            })
        }
        Err(error) => Err(Error::Socket {
            path: path.to_owned(),
            error,
        }),
    }
}

/// State owned by the accept thread.
struct AcceptLoop {
    listener: UnixListener,
    epoll: Epoll,
    controller: Arc<dyn VmController>,
    options: ServerOptions,
    stopping: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    in_flight: Arc<InFlight>,
}

impl AcceptLoop {
    fn run(self) {
        let mut events = [EpollEvent::default(); 2];
        while !self.stopping.load(Ordering::SeqCst) {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Should not happen; avoid spinning if it does.
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            if events[..n].iter().any(|e| e.data() == LISTENER_TOKEN) {
                self.accept_pending();
            }
        }
    }

    fn accept_pending(&self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.start_connection(stream),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // e.g. EMFILE: the listener stays readable, so back off
                    // instead of spinning on a level-triggered epoll.
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            }
        }
    }

    fn start_connection(&self, stream: UnixStream) {
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        let slot = ConnectionSlot::claim(&self.active, self.options.max_connections);
        let Some(slot) = slot else {
            let mut conn = Connection::new(stream);
            let _ = conn.write_response(
                &error_response(503, "too many API connections; try again".into()),
                Duration::from_millis(200),
            );
            return;
        };
        let controller = self.controller.clone();
        let options = self.options;
        let stopping = self.stopping.clone();
        let in_flight = self.in_flight.clone();
        // If spawning fails the closure, and with it the slot and the
        // stream, is dropped: the client sees the connection close.
        let _ = std::thread::Builder::new()
            .name("api-conn".into())
            .spawn(move || {
                sandbox::enter_or_exit(sandbox::ThreadKind::ApiConnection);
                let _slot = slot;
                serve_connection(stream, &*controller, &options, &stopping, &in_flight);
            });
    }
}

/// One of `max_connections` connection slots; released on drop, even if the
/// connection thread unwinds.
struct ConnectionSlot(Arc<AtomicUsize>);

impl ConnectionSlot {
    fn claim(active: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnectionSlot(active.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Requests between being read and being answered, across all connections.
/// A stop waits for them to drain.
#[derive(Debug, Default)]
struct InFlight {
    count: Mutex<usize>,
    drained: Condvar,
}

thread_local! {
    /// Whether this thread is between reading a request and answering it:
    /// a controller that stops the server from inside `handle` must not wait
    /// for its own answer.
    static ANSWERING: Cell<bool> = const { Cell::new(false) };
}

impl InFlight {
    /// Marks a request read; the guard marks it answered when dropped.
    fn begin(&self) -> Answering<'_> {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        ANSWERING.with(|a| a.set(true));
        Answering(self)
    }

    /// Waits until no request but the calling thread's own is being
    /// answered, or `deadline` passes.
    fn wait_idle(&self, deadline: Duration) {
        let own = usize::from(ANSWERING.with(|a| a.get()));
        let until = Instant::now() + deadline;
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *count > own {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            count = match self.drained.wait_timeout(count, left) {
                Ok((count, _)) => count,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// One request being answered; see [`InFlight::begin`].
struct Answering<'a>(&'a InFlight);

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        ANSWERING.with(|a| a.set(false));
        let mut count = self.0.count.lock().unwrap_or_else(|e| e.into_inner());
        *count -= 1;
        self.0.drained.notify_all();
    }
}

/// Serves requests on one connection until it closes, errs, times out, or
/// asks for `Connection: close`.
fn serve_connection(
    stream: UnixStream,
    controller: &dyn VmController,
    options: &ServerOptions,
    stopping: &AtomicBool,
    in_flight: &InFlight,
) {
    let limits = Limits {
        max_header_bytes: options.max_header_bytes,
        max_body_bytes: options.max_body_bytes,
        timeout: options.request_timeout,
    };
    let mut conn = Connection::new(stream);
    loop {
        let request = match conn.read_request(&limits) {
            Ok(request) => request,
            Err(ReadError::Closed) | Err(ReadError::Broken) => return,
            Err(ReadError::TimedOut) => {
                let message = format!(
                    "request not completed within {} ms",
                    options.request_timeout.as_millis()
                );
                let _ = conn.write_response(&error_response(408, message), options.request_timeout);
                return;
            }
            Err(ReadError::Reject { status, message }) => {
                let _ =
                    conn.write_response(&error_response(status, message), options.request_timeout);
                return;
            }
        };
        // Counted before `stopping` is read: a stop either sees this request
        // and waits for its answer, or set `stopping` first and it is 503.
        let answering = in_flight.begin();
        if stopping.load(Ordering::SeqCst) {
            let response = error_response(503, "the API server is shutting down".into());
            let _ = conn.write_response(&response, options.request_timeout);
            return close_then_done(conn, answering);
        }
        let mut response = dispatch(&request, controller);
        // A server stopped meanwhile closes the connection after this answer.
        response.keep_alive = request.keep_alive && !stopping.load(Ordering::SeqCst);
        if conn
            .write_response(&response, options.request_timeout)
            .is_err()
            || !response.keep_alive
        {
            return close_then_done(conn, answering);
        }
    }
}

/// Closes a connection whose last answer is written, and only then counts
/// the request done: a stop waiting for it returns with the client holding
/// the whole answer and its end. (Left to scope, the count went first and
/// the socket after: a client read after `stop` could still find it open,
/// 11 in 30 runs of the server tests beside two busy rigs.)
fn close_then_done(conn: Connection, answering: Answering<'_>) {
    drop(conn);
    drop(answering);
}

/// Maps a request to an action, runs it, and maps the outcome to a response.
fn dispatch(request: &Request, controller: &dyn VmController) -> Response {
    let route = match endpoints::lookup(&request.method, &request.path) {
        Lookup::Found(route) => route,
        Lookup::NotFound => {
            return error_response(404, format!("no such endpoint: {}", clip(&request.path)))
        }
        Lookup::WrongMethod(allowed) => {
            let mut r = error_response(
                405,
                format!(
                    "method {} is not allowed on {}; use {allowed}",
                    clip(&request.method),
                    request.path
                ),
            );
            r.allow = Some(allowed.as_str());
            return r;
        }
    };
    let action = match (route.parse)(&request.body) {
        Ok(action) => action,
        Err(e) => return api_error_response(e),
    };
    match catch_unwind(AssertUnwindSafe(|| controller.handle(action))) {
        Ok(Ok(ApiResponse::Empty)) => Response {
            status: 204,
            body: None,
            allow: None,
            keep_alive: false,
        },
        Ok(Ok(value)) => match serde_json::to_string(&value) {
            Ok(body) => Response {
                status: 200,
                body: Some(body),
                allow: None,
                keep_alive: false,
            },
            Err(e) => error_response(500, format!("cannot encode the response: {e}")),
        },
        Ok(Err(e)) => api_error_response(e),
        Err(_) => error_response(
            500,
            "the VMM failed internally while handling the request".into(),
        ),
    }
}

/// An [`ApiError`] as a response. Statuses outside 400–599 become 500: an
/// error must never reach the client looking like success.
fn api_error_response(e: ApiError) -> Response {
    let status = if (400..=599).contains(&e.status) {
        e.status
    } else {
        500
    };
    error_response(status, e.message)
}

/// A response with an [`ErrorBody`].
fn error_response(status: u16, message: String) -> Response {
    let body = serde_json::to_string(&ErrorBody { error: message })
        .unwrap_or_else(|_| r#"{"error":"internal error"}"#.to_owned());
    Response {
        status,
        body: Some(body),
        allow: None,
        keep_alive: false,
    }
}

/// Limits attacker-controlled text echoed back in error messages.
fn clip(s: &str) -> &str {
    const MAX: usize = 128;
    if s.len() <= MAX {
        return s;
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Entry point for the fuzz target in `fuzz/` (not an API).
#[doc(hidden)]
pub mod fuzzing {
    use std::io::{Read, Write};
    use std::net::Shutdown;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::{serve_connection, InFlight, ServerOptions};
    use crate::action::{ApiAction, ApiError, ApiResponse, VmController};

    /// Accepts every action with 204, or refuses a few with an error, so
    /// both answers are written.
    struct Agreeable;

    impl VmController for Agreeable {
        fn handle(&self, action: ApiAction) -> Result<ApiResponse, ApiError> {
            match action {
                ApiAction::Pause | ApiAction::Resume => Err(ApiError {
                    status: 409,
                    message: "not now".into(),
                }),
                _ => Ok(ApiResponse::Empty),
            }
        }
    }

    /// Serves one connection whose client sent `input` (any number of
    /// pipelined requests) and closed its sending side, as the server's
    /// connection threads do. Returns what the server wrote back; panics
    /// unless that is a sequence of well-framed HTTP/1.1 responses with
    /// statuses from 200 to 599 (after any 100 Continue).
    pub fn serve(input: &[u8]) -> std::io::Result<Vec<u8>> {
        let (mut client, server) = UnixStream::pair()?;
        // A socket pair buffers far more than a fuzz input and its answers.
        client.write_all(input)?;
        client.shutdown(Shutdown::Write)?;
        let options = ServerOptions {
            request_timeout: Duration::from_millis(200),
            max_body_bytes: 4096,
            max_header_bytes: 2048,
            ..ServerOptions::default()
        };
        serve_connection(
            server,
            &Agreeable,
            &options,
            &AtomicBool::new(false),
            &InFlight::default(),
        );
        let mut out = Vec::new();
        client.read_to_end(&mut out)?;
        check_responses(&out);
        Ok(out)
    }

    fn check_responses(mut out: &[u8]) {
        while !out.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut response = httparse::Response::new(&mut headers);
            let head = match response.parse(out) {
                Ok(httparse::Status::Complete(n)) => n,
                other => panic!("not an HTTP response: {other:?}"),
            };
            let status = response.code.unwrap_or(0);
            // 100 Continue has no body and precedes the real answer.
            if status == 100 {
                out = &out[head..];
                continue;
            }
            assert!((200..600).contains(&status), "status {status}");
            let length = response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| {
                    std::str::from_utf8(h.value)
                        .unwrap()
                        .parse::<usize>()
                        .unwrap()
                })
                .unwrap_or(0);
            assert!(out.len() >= head + length, "a response's body is cut short");
            out = &out[head + length..];
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn pipelined_requests_get_their_answers_in_order() {
            let out = serve(
                b"GET /api/v1/vmm.ping HTTP/1.1\r\n\r\n\
                  PUT /api/v1/vm.pause HTTP/1.1\r\nContent-Length: 0\r\n\r\n\
                  GET /nowhere HTTP/1.1\r\n\r\n",
            )
            .unwrap();
            let text = String::from_utf8(out).unwrap();
            let statuses: Vec<&str> = text
                .match_indices("HTTP/1.1 ")
                .map(|(i, _)| &text[i + 9..i + 12])
                .collect();
            assert_eq!(statuses, ["204", "409", "404"], "{text}");
        }

        #[test]
        #[should_panic(expected = "not an HTTP response")]
        fn a_broken_answer_is_a_finding() {
            check_responses(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}garbage");
        }
    }
}

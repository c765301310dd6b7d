//! The endpoint table: the one place that says which HTTP method and path
//! carry which [`ApiAction`].
//!
//! Both directions are generated from the single `routes!` list below: the
//! server looks requests up in [`ROUTES`] to build actions, and the client
//! asks [`ApiAction::to_request`] how to send one. Because `to_request` is a
//! generated exhaustive `match`, adding a variant to [`ApiAction`] without a
//! route is a compile error, and a route can never disagree with the client.
//!
//! To add an endpoint:
//! 1. add the variant to [`ApiAction`] (with a `Deserialize + Serialize`
//!    payload type if the request has a JSON body), and any new response
//!    variant to [`crate::ApiResponse`];
//! 2. add one line to the `routes!` list below;
//! 3. handle the variant in the VMM's [`crate::VmController`] (the compiler
//!    will insist), and describe it in `docs/api/openapi.yaml`.

use serde::de::DeserializeOwned;

use crate::action::{ApiAction, ApiError};

/// Common prefix of every endpoint path; bumped only for incompatible
/// changes so old clients fail with a clear 404 instead of misbehaving.
pub const API_PREFIX: &str = "/api/v1";

/// HTTP methods the API uses.
///
/// A closed enum rather than a string so that a typo in the route table is a
/// compile error; requests with any other method are answered with 405.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Read-only queries.
    Get,
    /// State changes (Cloud Hypervisor uses PUT for all actions).
    Put,
    /// Reserved for future endpoints that create things.
    Post,
    /// Reserved for future partial updates.
    Patch,
    /// Reserved for future endpoints that remove things.
    Delete,
}

impl Method {
    /// The method as it appears on the request line.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One endpoint: where it lives and how to turn a request body into an
/// action.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The only method this path accepts.
    pub method: Method,
    /// Full path, including [`API_PREFIX`].
    pub path: &'static str,
    /// Builds the action from the raw request body; errors become HTTP
    /// responses (400 for bad JSON).
    pub parse: fn(&[u8]) -> Result<ApiAction, ApiError>,
}

/// How to send an action: the route plus the JSON body, if any.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Method to use.
    pub method: Method,
    /// Path to request.
    pub path: &'static str,
    /// JSON body for endpoints that take one.
    pub body: Option<String>,
}

/// Checks that an endpoint without a request body was not sent one.
///
/// Empty bodies, whitespace, `{}` and `null` are accepted because common
/// tools (`curl -d '{}'`, HTTP libraries) send those by habit; anything else
/// is rejected rather than silently ignored, since it most likely means the
/// caller expected an endpoint that takes parameters.
pub fn expect_no_body(body: &[u8]) -> Result<(), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Null) => Ok(()),
        Ok(serde_json::Value::Object(map)) if map.is_empty() => Ok(()),
        _ => Err(ApiError::bad_request("this endpoint takes no request body")),
    }
}

/// Parses a JSON request body into the endpoint's payload type, turning
/// serde's message into a 400 so the caller learns which field was wrong.
pub fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "this endpoint needs a JSON request body",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON request body: {e}")))
}

/// Generates [`ROUTES`] and [`ApiAction::to_request`] from one list.
///
/// Each line is `METHOD "path" => Variant;` for actions without a body, or
/// `METHOD "path" => Variant(binding);` for actions whose single field is
/// the JSON request body (`binding` is just a local name for it).
macro_rules! routes {
    ($( $method:ident $path:literal => $variant:ident $( ( $binding:ident ) )? ; )*) => {
        /// Every endpoint the server serves, generated from the `routes!`
        /// list in this module.
        pub static ROUTES: &[Route] = &[
            $( Route {
                method: Method::$method,
                path: $path,
                parse: |body| routes!(@parse body, $variant $(, $binding)?),
            }, )*
        ];

        impl ApiAction {
            /// How the client sends this action: method, path and JSON body.
            ///
            /// Fails only if a payload cannot be serialized (e.g. a map with
            /// non-string keys), which would be a bug in the payload type.
            pub fn to_request(&self) -> Result<RequestSpec, serde_json::Error> {
                Ok(match self {
                    $( ApiAction::$variant $( ($binding) )? => RequestSpec {
                        method: Method::$method,
                        path: $path,
                        body: routes!(@encode $($binding)?),
                    }, )*
                })
            }
        }
    };
    (@parse $body:ident, $variant:ident) => {
        expect_no_body($body).map(|()| ApiAction::$variant)
    };
    (@parse $body:ident, $variant:ident, $binding:ident) => {
        json_body($body).map(ApiAction::$variant)
    };
    (@encode) => { None };
    (@encode $binding:ident) => { Some(serde_json::to_string($binding)?) };
}

// The endpoint list. Keep `docs/api/openapi.yaml` in step with it.
routes! {
    Get "/api/v1/vmm.ping"    => Ping;
    Get "/api/v1/vm.info"     => VmInfo;
    Put "/api/v1/vm.pause"    => Pause;
    Put "/api/v1/vm.resume"   => Resume;
    Put "/api/v1/vm.shutdown" => Shutdown;
    Get "/api/v1/vm.balloon"  => BalloonInfo;
    Put "/api/v1/vm.balloon"  => BalloonSet(target);
    Get "/api/v1/vm.mmu"      => MmuInfo;
    Put "/api/v1/vm.mmu"      => MmuSet(settings);
    Get "/api/v1/vm.display"  => DisplayInfo;
    Put "/api/v1/vm.display"  => DisplaySet(settings);
    Put "/api/v1/vm.snapshot" => Snapshot(request);
    Put "/api/v1/vm.migrate"  => Migrate(request);
    Get "/api/v1/vm.migration" => MigrationInfo;
    Put "/api/v1/vm.dump"     => Dump(request);
    Get "/api/v1/vm.isolation" => IsolationInfo;
    Get "/api/v1/vm.counters" => Counters;
    Put "/api/v1/vm.latency-histogram" => LatencyHistogramSet(request);
    Get "/api/v1/vm.iotrace"  => IoTraceInfo;
    Put "/api/v1/vm.iotrace"  => IoTraceSet(request);
    Put "/api/v1/vm.advise"   => Advise(request);
}

/// Result of looking a request up in [`ROUTES`].
#[derive(Debug, Clone, Copy)]
pub enum Lookup {
    /// Path and method match this route.
    Found(&'static Route),
    /// The path exists but only with this other method (answer 405).
    WrongMethod(Method),
    /// No such path (answer 404).
    NotFound,
}

/// Finds the route for a request. `path` must already be stripped of any
/// query string; `method` is compared case-sensitively, as HTTP requires.
pub fn lookup(method: &str, path: &str) -> Lookup {
    let mut other = None;
    for route in ROUTES.iter().filter(|r| r.path == path) {
        if route.method.as_str() == method {
            return Lookup::Found(route);
        }
        other = Some(route.method);
    }
    match other {
        Some(m) => Lookup::WrongMethod(m),
        None => Lookup::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_unique_and_prefixed() {
        for (i, a) in ROUTES.iter().enumerate() {
            assert!(a.path.starts_with(API_PREFIX), "{} lacks prefix", a.path);
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.path == b.path && a.method == b.method),
                    "duplicate route {} {}",
                    a.method,
                    a.path
                );
            }
        }
    }

    #[test]
    fn every_action_round_trips_through_its_route() {
        let actions = [
            ApiAction::Ping,
            ApiAction::VmInfo,
            ApiAction::Pause,
            ApiAction::Resume,
            ApiAction::Shutdown,
            ApiAction::BalloonInfo,
            ApiAction::BalloonSet(crate::action::BalloonTarget::balloon(128)),
            ApiAction::MmuInfo,
            ApiAction::MmuSet(crate::action::MmuSettings {
                spt_pages: crate::action::SptPages::Auto,
            }),
            ApiAction::DisplayInfo,
            ApiAction::DisplaySet(crate::action::DisplaySettings {
                dirty: Some(crate::action::DirtyMethod::Wp),
                refresh: None,
            }),
            ApiAction::Snapshot(crate::action::SnapshotRequest {
                path: "/tmp/vm.snap".into(),
            }),
            ApiAction::Migrate(crate::action::MigrateRequest {
                to: "tcp:10.0.0.2:4444".into(),
                mode: crate::action::MigrationMode::Postcopy,
                prefetch: Some(8),
                max_downtime_ms: Some(100),
                max_rounds: None,
                background: Some(true),
                resume: None,
                max_bandwidth_mib: None,
                verify_pages: Some(true),
            }),
            ApiAction::MigrationInfo,
            ApiAction::Dump(crate::action::DumpRequest {
                path: Some("/tmp/report.json".into()),
            }),
            ApiAction::IsolationInfo,
            ApiAction::Counters,
            ApiAction::LatencyHistogramSet(crate::action::LatencyHistogramRequest {
                id: "disk0".into(),
                histogram: Some(crate::action::LatencyHistogram::Flush),
                boundaries: Some("10us,1ms".parse().unwrap()),
            }),
            ApiAction::IoTraceInfo,
            ApiAction::IoTraceSet(crate::action::IoTraceRequest {
                action: crate::action::IoTraceAction::Start,
                disk: Some("data".into()),
                trace_file: Some("/tmp/trace.jsonl".into()),
                pids: vec![1, 42],
                comms: vec!["fio".into()],
                guest_dev: Some("/dev/vdb".into()),
            }),
            ApiAction::Advise(crate::action::AdviseRequest {
                disk: Some("data".into()),
                apply: true,
            }),
        ];
        assert_eq!(actions.len(), ROUTES.len());
        // A route's other forms.
        let others = [ApiAction::BalloonSet(crate::action::BalloonTarget::guest(
            96,
        ))];
        for action in actions.into_iter().chain(others) {
            let spec = action.to_request().unwrap();
            let Lookup::Found(route) = lookup(spec.method.as_str(), spec.path) else {
                panic!("no route for {action:?}");
            };
            let body = spec.body.unwrap_or_default();
            assert_eq!((route.parse)(body.as_bytes()).unwrap(), action);
        }
    }

    #[test]
    fn expected_wire_paths() {
        let spec = ApiAction::Pause.to_request().unwrap();
        assert_eq!((spec.method, spec.path), (Method::Put, "/api/v1/vm.pause"));
        let spec = ApiAction::VmInfo.to_request().unwrap();
        assert_eq!((spec.method, spec.path), (Method::Get, "/api/v1/vm.info"));
        assert!(spec.body.is_none());
    }

    #[test]
    fn lookup_distinguishes_404_and_405() {
        assert!(matches!(
            lookup("GET", "/api/v1/vmm.ping"),
            Lookup::Found(r) if r.path == "/api/v1/vmm.ping"
        ));
        assert!(matches!(
            lookup("PUT", "/api/v1/vmm.ping"),
            Lookup::WrongMethod(Method::Get)
        ));
        assert!(matches!(
            lookup("get", "/api/v1/vmm.ping"),
            Lookup::WrongMethod(Method::Get)
        ));
        assert!(matches!(lookup("GET", "/api/v1/nope"), Lookup::NotFound));
    }

    #[test]
    fn no_body_endpoints_tolerate_empty_json_but_not_payloads() {
        for ok in [&b""[..], b"  \r\n", b"{}", b"null", b" { } "] {
            assert!(expect_no_body(ok).is_ok(), "{:?}", ok);
        }
        for bad in [&b"{\"a\":1}"[..], b"[1]", b"garbage"] {
            assert_eq!(expect_no_body(bad).unwrap_err().status, 400);
        }
    }

    #[test]
    fn json_body_reports_field_errors_as_400() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct P {
            size_mib: u64,
        }
        assert_eq!(json_body::<P>(br#"{"size_mib": 3}"#).unwrap().size_mib, 3);
        let err = json_body::<P>(br#"{"size_mib": "x"}"#).unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.message.contains("size_mib") || err.message.contains("invalid type"));
        assert_eq!(json_body::<P>(b"").unwrap_err().status, 400);
    }
}

//! Keeps `docs/api/openapi.yaml` in step with the route table: every route
//! must be documented under its path with its method, and nothing else.

use api::endpoints::{API_PREFIX, ROUTES};

fn spec() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api/openapi.yaml");
    std::fs::read_to_string(path).expect("docs/api/openapi.yaml is readable")
}

#[test]
fn every_route_is_documented_with_its_method() {
    let spec = spec();
    assert!(spec.contains(&format!("url: http://localhost{API_PREFIX}\n")));
    let lines: Vec<&str> = spec.lines().collect();
    for route in ROUTES {
        let rel = route.path.strip_prefix(API_PREFIX).unwrap();
        let at = lines
            .iter()
            .position(|l| *l == format!("  {rel}:"))
            .unwrap_or_else(|| panic!("{} is not documented", route.path));
        let method = format!("    {}:", route.method.as_str().to_ascii_lowercase());
        // The path's block runs until the next path or section.
        let block = lines[at + 1..]
            .iter()
            .take_while(|l| l.starts_with("    ") || l.is_empty());
        assert!(
            block.clone().any(|l| *l == method),
            "{} {} is not documented",
            route.method,
            route.path
        );
    }
}

#[test]
fn no_undocumented_or_stale_paths() {
    let spec = spec();
    let documented: Vec<&str> = spec
        .lines()
        .filter(|l| l.starts_with("  /") && l.ends_with(':'))
        .map(|l| l.trim().trim_end_matches(':'))
        .collect();
    let mut routed: Vec<&str> = ROUTES
        .iter()
        .map(|r| r.path.strip_prefix(API_PREFIX).unwrap())
        .collect();
    routed.dedup();
    for d in &documented {
        assert!(routed.contains(d), "{d} is documented but not routed");
    }
    assert_eq!(documented.len(), routed.len());
}

use super::*;

fn route(pattern: &str, resource: Option<&str>) -> Route {
    let pattern = PathPattern::parse(pattern).unwrap();
    Route {
        resource: resource.map(|r| ResourceTemplate::parse(r, &pattern).unwrap()),
        pattern: Some(pattern),
        methods: DEFAULT_METHODS.to_vec(),
        policy: Policy::Fenced,
    }
}

#[test]
fn a_parameter_takes_one_decoded_segment() {
    let r = route("/orders/{id}", Some("orders/{id}"));
    assert_eq!(r.resource_of("/orders/42").as_deref(), Some("orders/42"));
    assert_eq!(
        r.resource_of("/orders/a%20b").as_deref(),
        Some("orders/a b")
    );
    assert_eq!(r.resource_of("/orders/42/items"), None);
    assert_eq!(r.resource_of("/orders"), None);
    assert_eq!(r.resource_of("/order/42"), None);
}

#[test]
fn a_rest_parameter_takes_the_remaining_segments() {
    let r = route("/files/{*path}", Some("file:{path}"));
    assert_eq!(r.resource_of("/files/a/b/c").as_deref(), Some("file:a/b/c"));
    assert_eq!(r.resource_of("/files"), None);
}

#[test]
fn without_a_template_the_resource_is_the_decoded_path_without_a_trailing_slash() {
    let r = route("/orders/{id}", None);
    assert_eq!(
        r.resource_of("/orders/%34%32").as_deref(),
        Some("/orders/42")
    );
    assert_eq!(r.resource_of("/orders/42/").as_deref(), Some("/orders/42"));
    let all = RouteTable::new(Vec::new(), Policy::Fenced);
    assert_eq!(all.routes()[0].resource_of("/").as_deref(), Some("/"));
    assert_eq!(all.routes()[0].resource_of("/a/").as_deref(), Some("/a"));
}

#[test]
fn a_fenced_route_refuses_methods_it_neither_checks_nor_knows_safe() {
    let mut r = route("/orders/{id}", None);
    r.methods = vec![Method::PUT];
    for m in ["POST", "DELETE", "MOVE", "put"] {
        assert!(r.refuses(&Method::from_bytes(m.as_bytes()).unwrap()), "{m}");
    }
    for m in [Method::PUT, Method::GET, Method::HEAD, Method::OPTIONS] {
        assert!(!r.refuses(&m), "{m}");
    }
    r.policy = Policy::Advisory;
    assert!(!r.refuses(&Method::POST));
}

#[test]
fn the_path_checks_take_any_bytes() {
    assert!(normalize("/%\u{20ac}").is_ok());
    assert!(normalize("/a%").is_ok());
}

#[test]
fn bad_patterns_and_templates_name_the_fault() {
    for (pattern, needle) in [
        ("orders/{id}", "must start with /"),
        ("/orders/{i-d}", "ASCII letters"),
        ("/orders/x{id}", "whole segment"),
        ("/{id}/{id}", "appears twice"),
        ("/{*rest}/x", "must be the last"),
        ("/a//b", "empty"),
        ("/a/../b", "`..`"),
        ("/a%2Fb/{id}", "could never match"),
        ("/%2e%2e/x", "`..`"),
        ("/a;b", "could never match"),
    ] {
        let e = PathPattern::parse(pattern).unwrap_err().to_string();
        assert!(e.contains(needle), "{pattern}: {e}");
    }
    let p = PathPattern::parse("/orders/{id}").unwrap();
    let e = ResourceTemplate::parse("orders/{order}", &p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`{order}`") && e.contains("/orders/{id}"), "{e}");
    assert!(ResourceTemplate::parse("orders/{id", &p).is_err());
    assert!(ResourceTemplate::parse("", &p).is_err());
}

#[test]
fn the_first_matching_route_serves_and_the_default_takes_the_rest() {
    let table = RouteTable::new(
        vec![route("/orders/export", None), route("/orders/{id}", None)],
        Policy::Open,
    );
    assert_eq!(table.find("/orders/export"), 0);
    assert_eq!(table.find("/orders/7"), 1);
    assert_eq!(table.find("/health"), 2);
    assert_eq!(table.routes()[2].label(), "default");
}

#[test]
fn every_spelling_of_a_path_normalizes_to_one() {
    for (raw, normal) in [
        ("/orders/1", "/orders/1"),
        ("/orders//1", "/orders/1"),
        ("/x/../orders/1", "/orders/1"),
        ("/x/%2e%2E/orders/./1", "/orders/1"),
        ("/orders/1/", "/orders/1/"),
        ("/orders/1/.", "/orders/1/"),
        ("/", "/"),
        ("//", "/"),
        ("/a/..", "/"),
    ] {
        assert_eq!(normalize(raw).unwrap(), normal, "{raw}");
    }
    assert!(matches!(normalize("/orders/1"), Ok(Cow::Borrowed(_))));
    assert_eq!(normalize("/../etc"), Err(PathError::AboveRoot));
    assert_eq!(normalize("/%2e%2e/etc"), Err(PathError::AboveRoot));
    assert_eq!(normalize("*"), Err(PathError::NotAbsolute));
    for (raw, what) in [
        ("/orders%2F1", "slash"),
        ("/orders%2f1", "slash"),
        ("/orders\\1", "a backslash"),
        ("/orders%5c1", "backslash"),
        ("/orders;jsessionid=1/1", "`;`"),
        ("/orders/1%00", "NUL"),
    ] {
        let e = normalize(raw).unwrap_err();
        assert!(matches!(e, PathError::Ambiguous(_)), "{raw}");
        assert!(e.to_string().contains(what), "{raw}: {e}");
    }
    assert!(
        normalize("/orders/%2").is_ok(),
        "a short escape is just text"
    );
}

#[test]
fn a_fenced_route_cannot_be_reached_by_another_spelling() {
    let table = RouteTable::new(
        vec![route("/orders/{id}", Some("orders/{id}"))],
        Policy::Open,
    );
    for raw in [
        "/orders/1",
        "/orders//1",
        "/x/../orders/1",
        "/x/%2e%2e/orders/1",
        "/./orders/1",
    ] {
        let path = normalize(raw).unwrap();
        let i = table.find(&path);
        assert_eq!(i, 0, "{raw}");
        assert_eq!(
            table.routes()[i].resource_of(&path).as_deref(),
            Some("orders/1")
        );
    }
}

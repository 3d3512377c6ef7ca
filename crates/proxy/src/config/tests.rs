use super::*;
use crate::route::Policy;

const GOOD: &str = r#"
listen = "127.0.0.1:8080"
upstream = "http://127.0.0.1:9000"
admin = "127.0.0.1:9464"

[store]
kind = "postgres"
database = "host=127.0.0.1 user=fence dbname=orders"

[timeouts]
upstream_ms = 1500

[default]
policy = "open"

[[route]]
path = "/orders/{id}"
methods = ["put", "DELETE"]
resource = "orders/{id}"
policy = "fenced"

[[route]]
path = "/legacy/{*rest}"
policy = "advisory"
"#;

#[test]
fn a_full_config_reads_into_routes_store_and_timeouts() {
    let c = ProxyConfig::parse("proxy.toml", GOOD).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.upstream, "http://127.0.0.1:9000");
    assert_eq!(
        c.store,
        StoreConfig::Postgres {
            database: "host=127.0.0.1 user=fence dbname=orders".into()
        }
    );
    assert_eq!(c.timeouts.upstream, Duration::from_millis(1500));
    assert_eq!(c.timeouts.connect, Timeouts::default().connect);
    let routes = c.routes.routes();
    assert_eq!(routes.len(), 3);
    assert_eq!(routes[0].methods, vec![Method::PUT, Method::DELETE]);
    assert_eq!(
        routes[0].resource_of("/orders/7").as_deref(),
        Some("orders/7")
    );
    assert_eq!(routes[1].policy, Policy::Advisory);
    assert_eq!(routes[1].methods, DEFAULT_METHODS.to_vec());
    assert_eq!(routes[2].policy, Policy::Open);
    assert_eq!(routes[2].label(), "default");
}

fn error(text: &str) -> ConfigError {
    ProxyConfig::parse("proxy.toml", text).unwrap_err()
}

#[test]
fn each_error_names_the_file_line_field_and_cause() {
    let base = "listen = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n";
    for (tail, line, field, cause) in [
        ("[[route]]\npath = \"/a\"\npolicy = \"fencd\"\n", 5, "route[0].policy", "`fencd` is not a policy"),
        ("[[route]]\npath = \"/a\"\npolicy = \"open\"\n[[route]]\npath = \"a/{id}\"\npolicy = \"open\"\n", 7, "route[1].path", "must start with /"),
        ("[[route]]\npath = \"/a/{id}\"\nresource = \"a/{nope}\"\npolicy = \"open\"\n", 5, "route[0].resource", "`{nope}`"),
        ("[[route]]\npath = \"/a\"\nmethods = [\"GE T\"]\npolicy = \"open\"\n", 5, "route[0].methods", "not an HTTP method"),
        ("[store]\nkind = \"etcd\"\n", 4, "store.kind", "memory, postgres, redis or mysql"),
        ("[store]\nkind = \"redis\"\n", 4, "store.url", "needs url = \"redis://"),
        ("[store]\nkind = \"mysql\"\nurl = \"postgres://db\"\n", 5, "store.url", "starts with mysql:// or mariadb://"),
        ("[store]\nkind = \"redis\"\ndatabase = \"host=db\"\n", 5, "store.database", "a redis store has no database"),
        ("[store]\nurl = \"redis://db\"\n", 4, "store.url", "a memory store has no url"),
        ("[store]\nkind = \"redis\"\nurl = \"redis://db\"\nprefix = \"a{b}\"\n", 6, "store.prefix", "brace"),
        ("[store]\nkind = \"mysql\"\nurl = \"mysql://db/x\"\nprefix = \"a:\"\n", 6, "store.prefix", "for kind = \"redis\""),
        ("[store]\nkind = \"postgres\"\ncapacity = 5\n", 5, "store.capacity", "for kind = \"memory\""),
        ("[store]\nkind = \"postgres\"\n", 4, "store.database", "needs database"),
        ("[timeouts]\nconnect_ms = 0\n", 4, "timeouts.connect_ms", "at least 1"),
        ("[timeouts]\nconnect_ms = \"2s\"\n", 4, "timeouts.connect_ms", "invalid type"),
        ("[store]\nkinds = \"memory\"\n", 4, "store.kinds", "unknown field"),
    ] {
        let e = error(&format!("{base}{tail}"));
        assert_eq!((e.file.as_str(), e.line, e.field.as_str()), ("proxy.toml", line, field), "{tail}: {e}");
        assert!(e.cause.contains(cause), "{tail}: {e}");
        assert!(e.to_string().starts_with(&format!("proxy.toml:{line}: {field}: ")), "{e}");
    }
    let e = error("listen = \"8080\"\nupstream = \"http://127.0.0.1:9000\"\n");
    assert_eq!((e.line, e.field.as_str()), (1, "listen"));
    let e = error("listen = \"127.0.0.1:1\"\nupstream = \"https://x:1\"\n");
    assert_eq!((e.line, e.field.as_str()), (2, "upstream"));
    let e = error("listen = \"127.0.0.1:1\"\nupstream = \"http://x:1/api\"\n");
    assert!(e.cause.contains("has a path"), "{e}");
    let e = error("upstream = \"http://x:1\"\n");
    assert!(e.cause.contains("listen"), "{e}");
}

#[test]
fn flags_make_a_one_route_config() {
    let c = ProxyConfig::from_flags(
        "127.0.0.1:0",
        "http://127.0.0.1:9000",
        "advisory",
        StoreConfig::Memory { capacity: 10 },
    )
    .unwrap();
    assert_eq!(c.routes.routes().len(), 1);
    assert_eq!(c.routes.routes()[0].policy, Policy::Advisory);
    let e = ProxyConfig::from_flags(
        "127.0.0.1:0",
        "http://x:1",
        "strict",
        StoreConfig::Memory { capacity: 10 },
    )
    .unwrap_err();
    assert_eq!(e.field, "--policy");
    assert_eq!(
        e.to_string(),
        "command line:0: --policy: `strict` is not a policy: fenced, advisory or open"
    );
}

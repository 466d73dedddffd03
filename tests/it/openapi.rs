//! The OpenAPI document (`docs/openapi.json`, served at `GET /v1/openapi.json`) describes exactly the
//! routes the router serves, and what the real service answers on each is a documented status with
//! the documented shape. (.ci/api-fuzz.sh fuzzes the same document with schemathesis.) Also the
//! regression tests for what the fuzzing and the writing of the document found.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, http};

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn document() -> Value {
    serde_json::from_str(hermes_hooks::server::OPENAPI).expect("docs/openapi.json is JSON")
}

/// (METHOD, path) of every operation in the document.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .expect("`paths` is an object")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("a path item is an object")
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .map(move |m| (m.to_ascii_uppercase(), path.clone()))
        })
        .collect()
}

/// Resolves a local `$ref` (`#/components/...`).
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling $ref {r}")),
        None => v,
    }
}

#[test]
fn document_lists_exactly_the_routes_of_the_router() {
    let doc = document();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "an OpenAPI 3 document"
    );
    let routes: BTreeSet<(String, String)> = hermes_hooks::bench_support::routes()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let documented = documented(&doc);
    let undocumented: Vec<_> = routes.difference(&documented).collect();
    let phantom: Vec<_> = documented.difference(&routes).collect();
    assert!(
        undocumented.is_empty() && phantom.is_empty(),
        "docs/openapi.json and server::routes() must agree; routes missing from the document: \
         {undocumented:?}; operations the router does not serve: {phantom:?}"
    );
}

#[test]
fn every_ref_resolves_and_every_operation_is_complete() {
    let doc = document();
    fn walk(doc: &Value, v: &Value) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    assert!(
                        doc.pointer(r.trim_start_matches('#')).is_some(),
                        "dangling $ref {r}"
                    );
                }
                m.values().for_each(|x| walk(doc, x));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(doc, x)),
            _ => {}
        }
    }
    walk(&doc, &doc);
    let mut ids = BTreeSet::new();
    for (method, path) in documented(&doc) {
        let op = &doc["paths"][&path][method.to_ascii_lowercase()];
        let id = op["operationId"].as_str().unwrap_or_default();
        assert!(
            ids.insert(id.to_string()) && !id.is_empty(),
            "{method} {path}: needs a unique operationId"
        );
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|k| k.starts_with('2')),
            "{method} {path}: documents no success answer"
        );
        let public = op["security"].as_array().is_some_and(|s| s.is_empty());
        assert!(
            public || responses.contains_key("401"),
            "{method} {path}: needs the token, so it must document 401"
        );
    }
    assert!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer",
        "the bearer token security scheme"
    );
}

/// Checks that `status` is documented for the operation and, for JSON answers, that the body has
/// the documented required keys (a shallow check; schemathesis checks the whole schema).
fn assert_documented(doc: &Value, method: &str, path: &str, status: u16, body: &[u8]) {
    let op = &doc["paths"][path][method.to_ascii_lowercase()];
    let response = op["responses"]
        .get(status.to_string())
        .unwrap_or_else(|| panic!("{method} {path} answered {status}, which it does not document"));
    let response = resolve(doc, response);
    if let Some(schema) = response["content"].get("application/json") {
        let schema = resolve(doc, &schema["schema"]);
        let body: Value = serde_json::from_slice(body)
            .unwrap_or_else(|e| panic!("{method} {path} {status}: body is not JSON: {e}"));
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().expect("required key");
            assert!(
                body.get(key).is_some(),
                "{method} {path} {status}: missing documented key {key:?} in {body}"
            );
        }
    }
}

#[test]
fn the_real_service_serves_the_document_and_answers_every_route_as_documented() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[\"agent:*\"]", "{'seen': True}");
    let token_file = hooks.tmp.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("write the token");
    let serve = Serve::start(&hooks, &["--token-file", token_file.to_str().unwrap()]);
    let auth = [
        ("Authorization", "Bearer s3cret"),
        ("Content-Type", "application/json"),
    ];
    let doc = document();

    let (s, headers, body) = http(&serve.addr, "GET", "/v1/openapi.json", &auth, b"");
    assert_eq!(s, 200);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("application/json")),
        "the document is served as JSON: {headers:?}"
    );
    let served: Value = serde_json::from_slice(&body).expect("served document is JSON");
    assert_eq!(served, doc, "GET /v1/openapi.json serves docs/openapi.json");

    for (method, path) in documented(&doc) {
        let url = path.replace("{name}", "rec");
        let body: &[u8] = match path.as_str() {
            "/v1/events" | "/v1/collect" => br#"{"event": "agent:start", "context": {"a": 1}}"#,
            "/v1/events/batch" => br#"{"events": [{"event": "agent:start"}]}"#,
            "/v1/proof" => br#"{"nonce": "000102030405060708090a0b0c0d0e0f"}"#,
            "/v1/dead/replay" => br#"{"all": true}"#,
            _ => b"",
        };
        let (s, _, answer) = http(&serve.addr, &method, &url, &auth, body);
        // Dead letters exist only on a fleet edge (tests/it/dead_api.rs): 404 `not_fleet` here.
        let fleet_only = path.starts_with("/v1/dead");
        assert!(
            if fleet_only {
                s == 404 && String::from_utf8_lossy(&answer).contains("not_fleet")
            } else {
                (200..300).contains(&s)
            },
            "{method} {url} should succeed with the token, got {s}: {}",
            String::from_utf8_lossy(&answer)
        );
        assert_documented(&doc, &method, &path, s, &answer);
        // Without the token: 401 as documented, except the probes.
        let (s, _, answer) = http(&serve.addr, &method, &url, &auth[1..], body);
        assert_documented(&doc, &method, &path, s, &answer);
        let public = doc["paths"][&path][method.to_ascii_lowercase()]["security"] == json!([]);
        assert_eq!(
            s,
            if public { 200 } else { 401 },
            "{method} {url} without the token"
        );
    }

    // Nothing else is served: an undocumented path is 404, an undocumented method 405, both as
    // the documented error shape.
    let (s, _, answer) = http(&serve.addr, "GET", "/v1/nothing", &auth, b"");
    assert_eq!(s, 404);
    let answer: Value = serde_json::from_slice(&answer).expect("JSON error");
    assert_eq!(answer["error"]["code"], "not_found");
    let (s, headers, answer) = http(&serve.addr, "DELETE", "/v1/hooks", &auth, b"");
    assert_eq!(s, 405);
    let answer: Value = serde_json::from_slice(&answer).expect("JSON error");
    assert_eq!(answer["error"]["code"], "method_not_allowed");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "allow" && v.contains("GET")),
        "a 405 says what is allowed: {headers:?}"
    );
}

/// Found while writing the document (every error is documented as JSON): a hook name that is
/// not valid UTF-8 once percent-decoded got axum's plain-text 400 instead of the API's JSON error.
#[test]
fn a_hook_name_that_does_not_decode_gets_a_json_400() {
    let hooks = Hooks::new();
    let serve = Serve::start(&hooks, &[]);
    let (s, headers, body) = http(&serve.addr, "GET", "/v1/hooks/%FF%FE", &[], b"");
    assert_eq!(s, 400, "{}", String::from_utf8_lossy(&body));
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("application/json")),
        "the error is JSON: {headers:?}"
    );
    let v: Value = serde_json::from_slice(&body).expect("JSON error");
    assert_eq!(v["error"]["code"], "bad_request");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("hook name")),
        "the message says what was wrong: {v}"
    );
    // A name that decodes but is not loaded is still a plain 404.
    let (s, _, _) = http(&serve.addr, "GET", "/v1/hooks/%C3%A9t%C3%A9", &[], b"");
    assert_eq!(s, 404);
}

/// The document limits event names with JSON Schema's `maxLength: 256`, which counts characters;
/// the service counted UTF-8 bytes, so a valid 200-character name of `é` (400 bytes) was refused.
/// Now the service counts characters too, in every place a name comes in.
#[test]
fn event_name_limit_counts_characters_as_documented() {
    let doc = document();
    assert_eq!(
        doc["components"]["schemas"]["EventName"]["maxLength"],
        json!(hermes_hooks::events::MAX_EVENT_NAME_LEN),
        "the document states the service's limit"
    );
    let hooks = Hooks::new();
    let serve = Serve::start(&hooks, &[]);
    let at_limit = "é".repeat(hermes_hooks::events::MAX_EVENT_NAME_LEN);
    let over = "é".repeat(hermes_hooks::events::MAX_EVENT_NAME_LEN + 1);
    for (path, ok, status) in [
        ("/v1/events", json!({"event": at_limit}), 202),
        ("/v1/collect", json!({"event": at_limit}), 200),
        (
            "/v1/events/batch",
            json!({"events": [{"event": at_limit}]}),
            202,
        ),
    ] {
        let (s, v) = serve.post(path, &ok);
        assert_eq!(s, status, "{path}: a 256-character name is valid: {v}");
    }
    let (s, v) = serve.post("/v1/events", &json!({"event": over}));
    assert_eq!(s, 400, "257 characters are over the limit: {v}");
    assert_eq!(v["error"]["code"], "invalid_event");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("257 characters")),
        "the message counts characters: {v}"
    );
}

/// Issue 26: a client refuses a service of another protocol, so every answer (a 401 and a 404
/// too) says its protocol in the `Hermes-Hooks-Protocol` header, the document's `info.version`;
/// `/healthz` says it and the release in its body.
#[test]
fn every_answer_says_the_protocol_version_of_the_document() {
    let hooks = Hooks::new();
    let token_file = hooks.tmp.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("write the token");
    let serve = Serve::start(&hooks, &["--token-file", token_file.to_str().unwrap()]);
    let doc = document();
    let protocol = doc["info"]["version"].as_str().expect("info.version");
    assert_eq!(
        protocol,
        hermes_hooks::server::PROTOCOL_VERSION.to_string(),
        "docs/openapi.json's info.version is the protocol version"
    );
    let auth = [("Authorization", "Bearer s3cret")];
    for (path, headers, status) in [
        ("/healthz", &[][..], 200),
        ("/v1/hooks", &auth[..], 200),
        ("/v1/hooks", &[][..], 401),
        ("/v1/nothing", &auth[..], 404),
    ] {
        let (s, answer_headers, _) = http(&serve.addr, "GET", path, headers, b"");
        assert_eq!(s, status, "GET {path}");
        let said = answer_headers
            .iter()
            .find(|(k, _)| k == "hermes-hooks-protocol")
            .map(|(_, v)| v.as_str());
        assert_eq!(said, Some(protocol), "GET {path} {s}: {answer_headers:?}");
        let server = answer_headers
            .iter()
            .find(|(k, _)| k == "server")
            .map(|(_, v)| v.clone());
        assert_eq!(
            server,
            Some(format!("hermes-hooks/{}", env!("CARGO_PKG_VERSION"))),
            "GET {path} {s}"
        );
    }
    let (_, _, body) = http(&serve.addr, "GET", "/healthz", &[], b"");
    let body: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(
        body,
        json!({"status": "ok", "protocol": hermes_hooks::server::PROTOCOL_VERSION, "version": env!("CARGO_PKG_VERSION")})
    );
}

/// Every error code the server writes (a string right after a `StatusCode::…,` in `src/`, as in
/// `ApiError::new(StatusCode::CONFLICT, "refused", …)`) is in the document's `Error` code list,
/// so a client generated from the document knows every code it can get.
#[test]
fn every_error_code_the_server_writes_is_documented() {
    let doc = document();
    let listed: BTreeSet<String> = doc
        .pointer("/components/schemas/Error/properties/error/properties/code/enum")
        .and_then(Value::as_array)
        .expect("the Error schema lists its codes")
        .iter()
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    let mut written = BTreeSet::new();
    let mut dirs = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text: String = std::fs::read_to_string(&path)
                    .expect("a source file is readable")
                    .split_whitespace()
                    .collect();
                for (i, _) in text.match_indices("StatusCode::") {
                    let rest = &text[i..];
                    let Some(comma) = rest.find(",\"") else {
                        continue;
                    };
                    let status = &rest["StatusCode::".len()..comma];
                    if !status.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                        continue;
                    }
                    let code = &rest[comma + 2..];
                    if let Some(end) = code.find('"') {
                        written.insert(code[..end].to_string());
                    }
                }
            }
        }
    }
    assert!(
        written.len() >= 10,
        "the scan found too few codes to be right: {written:?}"
    );
    let missing: Vec<_> = written.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "codes the server writes but docs/openapi.json does not list: {missing:?}"
    );
}

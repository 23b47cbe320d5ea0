//! `gpunet tokens list | create | revoke` through the real binary.

mod common;

use common::{free_port, json, Server};

#[test]
fn a_tenant_admin_creates_lists_and_revokes_a_users_token_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("server"), free_port(), &[]);
    let (ok, out, err) = s.cli("admin-secret", &["tenants", "--create", "t", "--output", "json"]);
    assert!(ok, "{err}");
    let tenant_admin = json(&out)["token"].as_str().unwrap().to_string();
    let (ok, out, err) =
        s.cli(&tenant_admin, &["tokens", "create", "--role", "tenant", "--user", "alice", "--expires-in", "30d"]);
    assert!(ok, "{err}");
    let alice = out.split_whitespace().last().unwrap().to_string();
    assert!(out.contains("for alice (shown once)") && alice.starts_with("gpn_"), "{out}");
    let (ok, out, err) = s.cli(&alice, &["submit", "--output", "json", "--", "true"]);
    assert!(ok, "{err}");
    let id = json(&out)["id"].as_u64().unwrap().to_string();
    let (_, out, _) = s.cli(&alice, &["show", &id]);
    assert!(out.contains("submitted by alice"), "{out}");
    let (ok, out, err) = s.cli(&tenant_admin, &["tokens", "list", "--output", "json"]);
    assert!(ok, "{err}");
    assert!(!out.contains(&alice) && !out.contains(&tenant_admin), "a secret was listed: {out}");
    let list = json(&out);
    let row = list.as_array().unwrap().iter().find(|t| t["user"] == "alice").unwrap().clone();
    assert!(row["expires_ms"].as_u64().is_some(), "{row}");
    // A member cannot manage tokens; the tenant admin revokes alice's, which stops working.
    let (ok, _, _) = s.cli(&alice, &["tokens", "list"]);
    assert!(!ok);
    let (ok, out, err) = s.cli(&tenant_admin, &["tokens", "revoke", row["id"].as_str().unwrap()]);
    assert!(ok && out.contains("revoked"), "{out}{err}");
    let (ok, _, err) = s.cli(&alice, &["jobs"]);
    assert!(!ok && err.contains("401"), "{err}");
}

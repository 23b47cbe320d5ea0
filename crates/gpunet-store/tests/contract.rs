//! The store contract: one suite of behavioural cases, run against every store (memory, SQLite, PostgreSQL). A case
//! gets `open`, which opens the store under test again on the same data (a "restart"; the memory store returns
//! itself). PostgreSQL runs in a private cluster started by the test (skipped, with a message, where PostgreSQL is
//! not installed, unless `CI=true`).

use gpunet_store::pg_cluster::PgCluster;
use gpunet_store::{
    copy, Counts, LedgerTotals, MemoryStore, PgStore, SampleRow, SqliteStore, Store, TokenRole, TokenRow, UsageRow,
    Write,
};
use serde_json::json;
use std::sync::{Arc, Mutex};

type Open = dyn Fn() -> Arc<dyn Store>;
/// A named case.
type Case = (&'static str, fn(&Open));

const CASES: &[Case] = &[
    ("writes_survive_reopening_and_upsert", writes_survive_reopening_and_upsert),
    ("token_records_survive_reopening_and_a_revoked_token_is_gone", token_records_survive_and_revoked_is_gone),
    ("concurrent_commits_are_grouped_and_all_durable", concurrent_commits_are_grouped_and_all_durable),
    ("samples_survive_a_reopen_and_old_ones_are_pruned", samples_survive_a_reopen_and_old_ones_are_pruned),
    ("usage_rows_filter_by_tenant_and_time", usage_rows_filter_by_tenant_and_time),
    ("events_keep_their_order_and_a_job_keeps_its_last_write", events_keep_order_and_job_keeps_last_write),
    ("tenants_and_nodes_keep_creation_order_through_updates", tenants_and_nodes_keep_creation_order),
    ("async_commits_call_back_once_each_in_order", async_commits_call_back_once_each_in_order),
    ("export_recreates_everything_in_another_store", export_recreates_everything_in_another_store),
    ("copy_refuses_a_target_that_is_not_empty", copy_refuses_a_target_that_is_not_empty),
    ("text_with_a_nul_is_stored_and_the_store_keeps_working", text_with_a_nul_is_stored),
    ("jobs_are_read_in_pages_in_id_order_as_stored", jobs_are_read_in_pages_in_id_order_as_stored),
];

fn run_all(store: &str, mut make: impl FnMut(&str) -> Box<Open>) {
    for (case, f) in CASES {
        eprintln!("{store}: {case}");
        let open = make(case);
        f(&*open);
    }
}

#[test]
fn memory_store_passes_the_contract() {
    run_all("memory", |_| {
        let s: Arc<dyn Store> = Arc::new(MemoryStore::new());
        Box::new(move || s.clone())
    });
}

#[test]
fn sqlite_store_passes_the_contract() {
    let root = tempfile::tempdir().unwrap();
    run_all("sqlite", |case| {
        let dir = root.path().join(case);
        Box::new(move || Arc::new(SqliteStore::open(&dir).unwrap()))
    });
}

#[test]
fn postgres_store_passes_the_contract() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    run_all("postgres", |case| {
        let url = pg.create_database(case).unwrap();
        Box::new(move || Arc::new(PgStore::open(&url).unwrap()))
    });
}

/// `gpunet admin migrate`'s path: everything in a SQLite store arrives in PostgreSQL, counted and compared.
#[test]
fn sqlite_to_postgres_copy_preserves_every_row() {
    let Some(pg) = PgCluster::start_for_test() else { return };
    let dir = tempfile::tempdir().unwrap();
    let from = SqliteStore::open(dir.path()).unwrap();
    fill(&from);
    let to = PgStore::open(&pg.create_database("migrated").unwrap()).unwrap();
    let counts = copy(&from, &to).unwrap();
    assert_eq!(counts, filled_counts());
    assert_eq!(dump(&to), dump(&from));
}

fn job(id: u64, state: &str) -> Write {
    Write::Job { id, tenant: "t".into(), state: state.into(), doc: json!({"id": id, "state": state}).to_string() }
}

fn writes_survive_reopening_and_upsert(open: &Open) {
    {
        let s = open();
        s.commit(vec![
            Write::Tenant { name: "t".into(), doc: json!({"weight": 1}) },
            Write::Token { hash: "abc".into(), role: TokenRole::Tenant, tenant: Some("t".into()) },
            job(1, "pending"),
            job(2, "pending"),
            Write::Event { job: 1, at_ms: 5, kind: "submitted".into(), message: "hello".into() },
        ])
        .unwrap();
        s.commit(vec![job(1, "running")]).unwrap();
    }
    let s = open();
    let snap = s.load().unwrap();
    assert_eq!(snap.tenants, vec![("t".to_string(), json!({"weight": 1}))]);
    assert_eq!(snap.tokens, vec![TokenRow { hash: "abc".into(), role: TokenRole::Tenant, tenant: Some("t".into()) }]);
    assert_eq!(snap.jobs.len(), 2);
    assert_eq!(doc(&snap.jobs[0].1)["state"], "running");
    assert_eq!(s.events(1).unwrap()[0].message, "hello");
}

fn token_records_survive_and_revoked_is_gone(open: &Open) {
    {
        let s = open();
        s.commit(vec![
            Write::Token { hash: "keep".into(), role: TokenRole::Tenant, tenant: Some("t".into()) },
            Write::TokenDoc { hash: "keep".into(), doc: json!({"role": "tenant", "tenant": "t"}) },
            Write::Token { hash: "gone".into(), role: TokenRole::Tenant, tenant: Some("t".into()) },
            Write::TokenDoc { hash: "gone".into(), doc: json!({"role": "tenant", "tenant": "t"}) },
            Write::Token { hash: "admin".into(), role: TokenRole::Admin, tenant: None },
        ])
        .unwrap();
        s.commit(vec![Write::RevokeToken { hash: "gone".into() }]).unwrap();
    }
    let snap = open().load().unwrap();
    let mut toks = snap.tokens;
    toks.sort_by(|a, b| a.hash.cmp(&b.hash));
    assert_eq!(
        toks,
        vec![
            TokenRow { hash: "admin".into(), role: TokenRole::Admin, tenant: None },
            TokenRow { hash: "keep".into(), role: TokenRole::Tenant, tenant: Some("t".into()) },
        ]
    );
    assert_eq!(snap.token_docs, vec![("keep".to_string(), json!({"role": "tenant", "tenant": "t"}))]);
}

fn concurrent_commits_are_grouped_and_all_durable(open: &Open) {
    let s = open();
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    s.commit(vec![
                        job(t * 1000 + i, "pending"),
                        Write::Event { job: t * 1000 + i, at_ms: i, kind: "submitted".into(), message: String::new() },
                    ])
                    .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    drop(s);
    let s = open();
    assert_eq!(s.load().unwrap().jobs.len(), 800);
    let c = s.counts().unwrap();
    assert_eq!((c.jobs, c.events), (800, 800));
}

fn samples_survive_a_reopen_and_old_ones_are_pruned(open: &Open) {
    let at = |t: u64| SampleRow { at_ms: t, gpus_total: 8, gpus_allocated: t / 10, queue_length: 1, running: 2 };
    {
        let s = open();
        for t in [10, 20, 30] {
            s.commit(vec![Write::Sample { sample: at(t), keep_since_ms: 15 }]).unwrap();
        }
    }
    let s = open();
    assert_eq!(s.samples(0).unwrap(), vec![at(20), at(30)], "10 is older than the kept window");
    assert_eq!(s.samples(25).unwrap(), vec![at(30)]);
}

fn usage(tenant: &str, start_ms: u64, end_ms: u64) -> UsageRow {
    UsageRow {
        job: 1,
        tenant: tenant.into(),
        start_ms,
        end_ms,
        gpu_model: "A100-80GB".into(),
        lifecycle: "on-demand".into(),
        gpu_seconds: 10.0,
        cpu_seconds: 1.0,
        mem_gib_seconds: 1.0,
        gpu_cost: 0.3,
        cpu_cost: 0.15,
        mem_cost: 0.05,
        cost: 0.5,
        submitted_by: "alice".into(),
        sampled_gpu_seconds: 8.0,
        busy_gpu_seconds: 2.0,
    }
}

fn usage_rows_filter_by_tenant_and_time(open: &Open) {
    let s = open();
    s.commit(vec![
        Write::Usage(usage("a", 0, 100)),
        Write::Usage(usage("b", 50, 150)),
        Write::Usage(usage("a", 200, 300)),
    ])
    .unwrap();
    assert_eq!(s.usage(Some("a"), 0, 1000).unwrap(), vec![usage("a", 0, 100), usage("a", 200, 300)]);
    assert_eq!(s.usage(None, 120, 250).unwrap().len(), 2);
    assert_eq!(s.usage(Some("b"), 0, 40).unwrap().len(), 0);
    assert_eq!(s.usage(None, 0, u64::MAX).unwrap().len(), 3, "an open end is no error");
    // The ledger's sums per tenant (what the server's cumulative counters start from), the same after a reopen.
    let want = std::collections::BTreeMap::from([
        ("a".to_string(), LedgerTotals { gpu_seconds: 20.0, cost: 1.0 }),
        ("b".to_string(), LedgerTotals { gpu_seconds: 10.0, cost: 0.5 }),
    ]);
    assert_eq!(s.ledger_totals().unwrap(), want);
    assert_eq!(open().ledger_totals().unwrap(), want);
}

fn events_keep_order_and_job_keeps_last_write(open: &Open) {
    let ev = |job, at_ms, kind: &str| Write::Event { job, at_ms, kind: kind.into(), message: format!("{kind} {job}") };
    {
        let s = open();
        // Within one batch, a job written twice keeps its last document.
        s.commit(vec![job(7, "pending"), ev(7, 1, "submitted"), job(7, "running"), ev(7, 2, "started")]).unwrap();
        s.commit(vec![ev(8, 3, "submitted"), ev(7, 4, "finished"), job(7, "succeeded")]).unwrap();
    }
    let s = open();
    let rows = s.events(7).unwrap();
    let kinds: Vec<_> = rows.iter().map(|e| (e.at_ms, e.kind.as_str(), e.message.as_str())).collect();
    assert_eq!(
        kinds,
        vec![(1, "submitted", "submitted 7"), (2, "started", "started 7"), (4, "finished", "finished 7")]
    );
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq), "sequence numbers increase: {rows:?}");
    let jobs = s.load().unwrap().jobs;
    assert_eq!((jobs.len(), jobs[0].0, doc(&jobs[0].1)), (1, 7, json!({"id": 7, "state": "succeeded"})));
    assert!(s.events(9).unwrap().is_empty());
}

fn tenants_and_nodes_keep_creation_order(open: &Open) {
    {
        let s = open();
        for n in ["zeta", "alpha", "mid"] {
            s.commit(vec![
                Write::Tenant { name: n.into(), doc: json!({"v": 1}) },
                Write::Node { name: format!("node-{n}"), doc: json!({"v": 1}) },
            ])
            .unwrap();
        }
        s.commit(vec![
            Write::Tenant { name: "zeta".into(), doc: json!({"v": 2}) },
            Write::Node { name: "node-zeta".into(), doc: json!({"v": 2}) },
        ])
        .unwrap();
    }
    let snap = open().load().unwrap();
    let names: Vec<_> = snap.tenants.iter().map(|(n, d)| (n.as_str(), d["v"].as_i64().unwrap())).collect();
    assert_eq!(names, vec![("zeta", 2), ("alpha", 1), ("mid", 1)]);
    let nodes: Vec<_> = snap.nodes.iter().map(|(n, d)| (n.as_str(), d["v"].as_i64().unwrap())).collect();
    assert_eq!(nodes, vec![("node-zeta", 2), ("node-alpha", 1), ("node-mid", 1)]);
}

fn async_commits_call_back_once_each_in_order(open: &Open) {
    let s = open();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..200u64 {
        let (seen, tx) = (seen.clone(), tx.clone());
        s.commit_async(
            vec![job(1, &format!("s{i}")), Write::Event { job: 1, at_ms: i, kind: "k".into(), message: String::new() }],
            Box::new(move |r| {
                seen.lock().unwrap().push(i);
                tx.send(r.is_ok()).unwrap();
            }),
        );
    }
    for _ in 0..200 {
        assert!(rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap());
    }
    assert_eq!(*seen.lock().unwrap(), (0..200).collect::<Vec<_>>(), "each batch answered once, in order");
    drop(s);
    let s = open();
    assert_eq!(doc(&s.load().unwrap().jobs[0].1)["state"], "s199", "applied in the order queued");
    let at: Vec<u64> = s.events(1).unwrap().iter().map(|e| e.at_ms).collect();
    assert_eq!(at, (0..200).collect::<Vec<_>>());
}

/// A store of every kind of row.
fn fill(s: &dyn Store) {
    s.commit(vec![
        Write::Tenant { name: "team-b".into(), doc: json!({"weight": 2}) },
        Write::Tenant { name: "team-a".into(), doc: json!({"weight": 1}) },
        Write::Token { hash: "h-admin".into(), role: TokenRole::Admin, tenant: None },
        Write::Token { hash: "h-join".into(), role: TokenRole::Agent, tenant: None },
        Write::Token { hash: "h-a".into(), role: TokenRole::Tenant, tenant: Some("team-a".into()) },
        Write::Token { hash: "h-old".into(), role: TokenRole::Tenant, tenant: Some("team-b".into()) },
        Write::TokenDoc { hash: "h-a".into(), doc: json!({"role": "tenant", "tenant": "team-a", "user": "alice"}) },
        Write::Node { name: "gpu-2".into(), doc: json!({"gpus": 8}) },
        Write::Node { name: "gpu-1".into(), doc: json!({"gpus": 4}) },
    ])
    .unwrap();
    s.commit(vec![Write::RevokeToken { hash: "h-old".into() }]).unwrap();
    for id in 1..=3 {
        s.commit(vec![
            Write::Job {
                id,
                tenant: "team-a".into(),
                state: "pending".into(),
                doc: json!({"id": id, "s": "pending"}).to_string(),
            },
            Write::Event { job: id, at_ms: 100 + id, kind: "submitted".into(), message: format!("job {id} ✓") },
        ])
        .unwrap();
    }
    s.commit(vec![
        Write::Job {
            id: 2,
            tenant: "team-a".into(),
            state: "succeeded".into(),
            doc: json!({"id": 2, "s": "done"}).to_string(),
        },
        Write::Event { job: 2, at_ms: 200, kind: "finished".into(), message: "exit 0".into() },
        Write::Usage(usage("team-a", 100, 200)),
        Write::Usage(UsageRow { job: 2, ..usage("team-b", 150, 250) }),
    ])
    .unwrap();
    for t in [1000, 2000, 3000] {
        let sample = SampleRow { at_ms: t, gpus_total: 12, gpus_allocated: t / 1000, queue_length: 3, running: 1 };
        s.commit(vec![Write::Sample { sample, keep_since_ms: 0 }]).unwrap();
    }
}

fn filled_counts() -> Counts {
    Counts { tenants: 2, tokens: 3, token_docs: 1, nodes: 2, jobs: 3, events: 4, usage: 2, samples: 3 }
}

/// Everything a store holds, comparable across stores (sequence numbers left out; order kept).
#[derive(Debug, PartialEq)]
struct Dump {
    snapshot: gpunet_store::Snapshot,
    events: Vec<(u64, u64, String, String)>,
    usage: Vec<UsageRow>,
    samples: Vec<SampleRow>,
    counts: Counts,
}

/// A stored job document, parsed.
fn doc(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

fn dump(s: &dyn Store) -> Dump {
    let mut snapshot = s.load().unwrap();
    // Compared as JSON, not as text (each database spells a document its own way).
    for j in &mut snapshot.jobs {
        j.1 = doc(&j.1).to_string();
    }
    snapshot.tokens.sort_by(|a, b| a.hash.cmp(&b.hash));
    snapshot.token_docs.sort_by(|a, b| a.0.cmp(&b.0));
    let events = snapshot
        .jobs
        .iter()
        .flat_map(|(id, _)| s.events(*id).unwrap())
        .map(|e| (e.job, e.at_ms, e.kind, e.message))
        .collect();
    Dump {
        events,
        usage: s.usage(None, 0, u64::MAX).unwrap(),
        samples: s.samples(0).unwrap(),
        counts: s.counts().unwrap(),
        snapshot,
    }
}

fn export_recreates_everything_in_another_store(open: &Open) {
    let s = open();
    fill(&*s);
    assert_eq!(s.counts().unwrap(), filled_counts());
    let to = MemoryStore::new();
    assert_eq!(copy(&*s, &to).unwrap(), filled_counts());
    let d = dump(&to);
    assert_eq!(d, dump(&*s));
    assert_eq!(d.events[0], (1, 101, "submitted".to_string(), "job 1 ✓".to_string()));
}

fn copy_refuses_a_target_that_is_not_empty(open: &Open) {
    let s = open();
    s.commit(vec![job(1, "pending")]).unwrap();
    let from = MemoryStore::new();
    fill(&from);
    let e = copy(&from, &*s).unwrap_err().to_string();
    assert!(e.contains("not empty") && e.contains("jobs: 1"), "{e}");
    assert_eq!(s.counts().unwrap(), Counts { jobs: 1, ..Counts::default() }, "nothing was copied");
}

/// PostgreSQL's text cannot hold NUL: one NUL in an event (a job's name, an exit message) failed the commit and
/// turned the server read-only. Every store takes it (PostgreSQL keeps U+FFFD in its place).
fn text_with_a_nul_is_stored(open: &Open) {
    let s = open();
    s.commit(vec![
        Write::Tenant { name: "t\0".into(), doc: json!({"n": "a\u{0}b"}) },
        job(1, "pending\0"),
        Write::Event { job: 1, at_ms: 1, kind: "submitted".into(), message: "name a\0b".into() },
        Write::Usage(UsageRow { submitted_by: "al\0ice".into(), ..usage("t", 0, 10) }),
    ])
    .unwrap();
    s.commit(vec![job(2, "pending")]).unwrap();
    let m = s.events(1).unwrap()[0].message.clone();
    assert!(m == "name a\0b" || m == "name a\u{FFFD}b", "{m:?}");
    let snap = s.load().unwrap();
    assert_eq!(snap.jobs.len(), 2);
    assert_eq!(snap.tenants[0].1, json!({"n": "a\u{0}b"}), "documents keep NUL (JSON escapes it)");
}

/// A server starts by reading its jobs a page at a time: every job once, in id order, its text as written; the
/// rest of the snapshot keeps no job.
fn jobs_are_read_in_pages_in_id_order_as_stored(open: &Open) {
    let s = open();
    // Out of order, with gaps, and one rewritten.
    let ids = [7u64, 3, 250, 1, 42, 99, 100, 5];
    s.commit(ids.iter().map(|id| job(*id, "pending")).collect()).unwrap();
    s.commit(vec![Write::Job {
        id: 42,
        tenant: "t".into(),
        state: "running".into(),
        doc: r#"{"id":42,"x":"y z"}"#.into(),
    }])
    .unwrap();
    let s = open();
    assert!(s.load_meta().unwrap().jobs.is_empty(), "load_meta keeps no job");
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.jobs_page(after, 3).unwrap();
        assert!(page.len() <= 3, "a page holds at most its limit");
        let Some(last) = page.last().map(|(id, _)| *id) else { break };
        after = Some(last);
        seen.extend(page);
    }
    let mut want = ids.to_vec();
    want.sort_unstable();
    assert_eq!(seen.iter().map(|(id, _)| *id).collect::<Vec<_>>(), want);
    assert_eq!(seen.iter().find(|(id, _)| *id == 42).unwrap().1, r#"{"id":42,"x":"y z"}"#, "the text as written");
    assert_eq!(s.jobs_page(Some(250), 10).unwrap(), Vec::new(), "nothing after the last");
    assert_eq!(s.jobs_page(Some(5), 2).unwrap().iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![7, 42]);
    // `load` is the same jobs, whole.
    assert_eq!(s.load().unwrap().jobs, seen);
}

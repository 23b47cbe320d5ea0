//! Durable commits per second of each store from 16 threads, each commit one submission's writes (a job document of
//! about 600 bytes and its event), without the server around it. Ignored by default; run with
//! `cargo test --release -p gpunet-store --test throughput -- --ignored --nocapture`.

use gpunet_store::pg_cluster::PgCluster;
use gpunet_store::{PgStore, SqliteStore, Store, Write};
use std::sync::Arc;
use std::time::Instant;

const THREADS: u64 = 16;
const PER_THREAD: u64 = 1250;

fn measure(name: &str, s: Arc<dyn Store>) -> f64 {
    let doc = serde_json::json!({"name": "bench", "command": ["sleep", "1"], "pad": "x".repeat(500)});
    let t = Instant::now();
    let hs: Vec<_> = (0..THREADS)
        .map(|th| {
            let (s, doc) = (s.clone(), doc.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                for i in 0..PER_THREAD {
                    let id = th * 1_000_000 + i + 1;
                    let t = Instant::now();
                    s.commit(vec![
                        Write::Job { id, tenant: "bench".into(), state: "pending".into(), doc: doc.to_string() },
                        Write::Event { job: id, at_ms: i, kind: "submitted".into(), message: "submitted".into() },
                    ])
                    .unwrap();
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<f64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let rate = (THREADS * PER_THREAD) as f64 / t.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!("{name}: {rate:.0} commits/s, p50 {:.2} ms, p99 {:.2} ms", q(0.5), q(0.99));
    assert_eq!(s.counts().unwrap().jobs, THREADS * PER_THREAD);
    rate
}

#[test]
#[ignore = "a measurement; run with --ignored --release"]
fn commits_per_second_of_sqlite_and_postgres() {
    let dir = tempfile::tempdir().unwrap();
    measure("sqlite", Arc::new(SqliteStore::open(dir.path()).unwrap()));
    let Some(pg) = PgCluster::start_for_test() else { return };
    measure("postgres", Arc::new(PgStore::open(&pg.create_database("bench").unwrap()).unwrap()));
}

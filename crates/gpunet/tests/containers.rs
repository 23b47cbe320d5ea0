//! Container jobs (issue 14) through a real agent and a real OCI runtime (runc), with images built offline here from
//! busybox-static: an unpacked root filesystem (`dir:tiny`) and an OCI layout made by umoci (`oci:lay:1`). Each test
//! checks that nothing is left behind: no container in the runtime's state, no bundle, no cgroup, no mount.
//!
//! Needs root, runc, umoci, tini-static and a static busybox (`.ci/run` installs them); elsewhere each test says it
//! skipped (under `CI=true` a missing tool fails it).

mod common;

use common::{free_port, json, read, submit_yaml, wait_for, Frozen, Proc, Server};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Whether this machine can run the tests; says why not (and fails under CI).
fn can_run() -> bool {
    let missing: Vec<&str> = ["runc", "umoci", "tini-static"]
        .into_iter()
        .filter(|t| {
            !Command::new("sh").args(["-c", &format!("command -v {t}")]).output().is_ok_and(|o| o.status.success())
        })
        .collect();
    let static_busybox = Command::new("sh")
        .args(["-c", "command -v busybox >/dev/null && ! ldd \"$(command -v busybox)\" >/dev/null 2>&1"])
        .status()
        .is_ok_and(|s| s.success());
    let root = nix_root();
    if missing.is_empty() && static_busybox && root {
        return true;
    }
    let why = format!("missing: {missing:?}, static busybox: {static_busybox}, root: {root}");
    assert!(
        std::env::var_os("CI").is_none(),
        "CI installs runc, umoci, tini and busybox-static and runs as root ({why})"
    );
    eprintln!("SKIPPED: container tests need root, runc, umoci, tini-static and busybox-static ({why})");
    false
}

fn nix_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

fn run(cmd: &mut Command) {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// Builds the test images under `images`: `tiny` (busybox and its applets, a root filesystem) and the OCI layout
/// `lay` tagged `1` (the same files, with the image's own PATH, working directory /work and command).
fn build_images(images: &Path) {
    let tiny = images.join("tiny");
    for d in ["bin", "etc", "tmp", "proc", "dev", "sys", "work"] {
        std::fs::create_dir_all(tiny.join(d)).unwrap();
    }
    let busybox = String::from_utf8(Command::new("sh").args(["-c", "command -v busybox"]).output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    std::fs::copy(&busybox, tiny.join("bin/busybox")).unwrap();
    // The installed one lists the applets: the copy just written may still be open for writing in a child another
    // test thread forked meanwhile (exec would fail with ETXTBSY).
    let applets = Command::new(&busybox).arg("--list").output().unwrap().stdout;
    for a in String::from_utf8(applets).unwrap().lines().filter(|a| *a != "busybox") {
        // Relative links: they resolve inside the container too.
        std::os::unix::fs::symlink("busybox", tiny.join("bin").join(a)).unwrap();
    }
    std::fs::write(tiny.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
    let lay = images.join("lay");
    let bundle = images.join("lay-bundle");
    run(Command::new("umoci").args(["init", "--layout"]).arg(&lay));
    run(Command::new("umoci").args(["new", "--image"]).arg(format!("{}:1", lay.display())));
    run(Command::new("umoci").args(["unpack", "--image"]).arg(format!("{}:1", lay.display())).arg(&bundle));
    run(Command::new("cp").arg("-a").arg(format!("{}/.", tiny.display())).arg(bundle.join("rootfs")));
    run(Command::new("umoci").args(["repack", "--image"]).arg(format!("{}:1", lay.display())).arg(&bundle));
    run(Command::new("umoci")
        .args(["config", "--image"])
        .arg(format!("{}:1", lay.display()))
        .args(["--config.env", "PATH=/bin:/sbin", "--config.workingdir", "/work"])
        .args(["--config.cmd", "sh", "--config.cmd", "-c", "--config.cmd"])
        .arg("echo image-default in $(pwd) PATH=$PATH"));
    std::fs::remove_dir_all(&bundle).unwrap();
}

/// Fake GPU device nodes with the NVIDIA driver's numbers (char 195:N, nvidiactl 195:255).
fn fake_devices(dir: &Path) -> PathBuf {
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    for (name, minor) in [("nvidia0", "0"), ("nvidia1", "1"), ("nvidiactl", "255")] {
        run(Command::new("mknod").arg(dev.join(name)).args(["c", "195", minor]));
    }
    dev
}

struct Setup {
    dir: tempfile::TempDir,
    s: Server,
    images: PathBuf,
}

fn setup(server_flags: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    build_images(&images);
    let s = Server::start(&dir.path().join("server"), free_port(), server_flags);
    let (ok, _, err) = s.cli("admin-secret", &["tenants", "--create", "t"]);
    assert!(ok, "{err}");
    Setup { dir, s, images }
}

impl Setup {
    fn agent(&self, name: &str, gpus: &str, extra: &[&str]) -> Proc {
        let dev = self.dir.path().join("dev");
        if !dev.exists() {
            fake_devices(self.dir.path());
        }
        let mut flags = vec![
            "--image-dir",
            self.images.to_str().unwrap(),
            "--device-dir",
            dev.to_str().unwrap(),
            "--tenant-uid-base",
            "210000",
        ];
        flags.extend_from_slice(extra);
        self.s.agent_with(name, gpus, self.dir.path(), "127.0.0.1", &flags)
    }

    /// The agent's tag in its container ids (`gpunet_agent::container::agent_tag`: 8 hex digits of a hash of its data
    /// directory).
    fn tag(&self, node: &str) -> String {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.dir.path().join(node).canonicalize().unwrap().hash(&mut h);
        format!("{:08x}", h.finish() as u32)
    }

    fn log(&self, node: &str, id: u64, attempt: u32) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{node}/logs/job-{id}/rank-0-attempt-{attempt}.log")))
            .unwrap_or_default()
    }

    fn view(&self, id: u64) -> serde_json::Value {
        let (_, o, _) = self.s.cli("admin-secret", &["show", &id.to_string(), "--output", "json"]);
        json(&o)
    }

    /// The containers the node's runtime knows (id and status).
    fn containers(&self, node: &str) -> Vec<(String, String)> {
        let state = self.dir.path().join(node).join("containers/state");
        let o = Command::new("runc").arg("--root").arg(&state).args(["list", "--format", "json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let id = c["id"].as_str().unwrap_or("").to_string();
                        (id, format!("{} pid {}", c["status"].as_str().unwrap_or(""), c["pid"]))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What a node's containers left: runtime state, bundles, cgroups beneath the agent's groups, mounts of a bundle.
    fn leftovers(&self, node: &str) -> Vec<String> {
        let mut out: Vec<String> =
            self.containers(node).into_iter().map(|(id, st)| format!("container {id} {st}")).collect();
        let bundles = self.dir.path().join(node).join("containers/bundles");
        if let Ok(rd) = std::fs::read_dir(&bundles) {
            out.extend(rd.flatten().map(|e| format!("bundle {}", e.path().display())));
        }
        // Beneath the agent's own groups, and the runtime's groups named after the containers elsewhere.
        let find = Command::new("find")
            .args(["/sys/fs/cgroup", "-maxdepth", "7", "-type", "d"])
            .args([
                "(",
                "-path",
                &format!("*/gpunet-{node}-*/*"),
                "-o",
                "-name",
                &format!("gpunet-{}-job-*", self.tag(node)),
                ")",
            ])
            .output()
            .unwrap();
        out.extend(String::from_utf8_lossy(&find.stdout).lines().map(|l| format!("cgroup {l}")));
        let needle = bundles.display().to_string();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(m) = std::fs::read_to_string(e.path().join("mountinfo")) {
                if m.contains(&needle) {
                    out.push(format!("mount in {}", e.path().display()));
                }
            }
        }
        out
    }

    /// Cancels a job, waits for its end, then for nothing of the node's containers to be left.
    fn cancel_and_clean(&self, node: &str, id: u64) {
        let (ok, _, e) = self.s.cli("admin-secret", &["cancel", &id.to_string()]);
        assert!(ok, "{e}");
        wait_for(Duration::from_secs(60), || self.s.job_state(id) == "cancelled");
        self.wait_clean(node);
    }

    fn wait_clean(&self, node: &str) {
        let t = std::time::Instant::now();
        loop {
            let left = self.leftovers(node);
            if left.is_empty() {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "left behind: {left:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn exit_code(v: &serde_json::Value) -> Option<i64> {
    v["attempts"].as_array()?.iter().rev().find_map(|e| e["exit_code"].as_i64())
}

/// The container job contract on one node: the image's files and only its own GPUs, the tenant's uid without
/// capabilities, exit codes, the image's own command and environment, OOM, cancel through the init, volumes, a
/// host path only where the node allows it, the Kubernetes Job's container, and nothing left behind.
#[test]
fn container_jobs_run_in_their_image_with_only_their_gpus_and_leave_nothing_behind() {
    if !can_run() {
        return;
    }
    let st = setup(&[]);
    let shared = st.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("dataset.txt"), "the-dataset\n").unwrap();
    // A node that runs no containers: a job with an image is refused while it is the only one, saying why.
    let _p = st.agent("p1", "4xT4", &["--container-runtime", "none"]);
    let (ok, o, e) = st.s.cli("admin-secret", &["submit", "--tenant", "t", "--image", "dir:tiny", "--", "true"]);
    assert!(!ok && e.contains("its container image needs a node labelled gpunet.io/containers=true"), "{o}{e}");
    let _a = st.agent("c1", "2xT4", &["--allow-host-path", shared.to_str().unwrap()]);
    let (_, nodes, _) = st.s.cli("admin-secret", &["nodes", "--output", "json"]);
    let nodes = json(&nodes);
    let c1 = nodes.as_array().unwrap().iter().find(|n| n["name"] == "c1").unwrap();
    let labels = &c1["labels"];
    assert_eq!(
        (labels["gpunet.io/containers"].as_str(), labels["gpunet.io/container-runtime"].as_str()),
        (Some("true"), Some("runc"))
    );

    // Its GPU and no other, its uid, no capabilities, the init as PID 1, the image's files, the exit code.
    let probe = "ls /dev | grep nvidia | tr '\\n' ' '; echo; echo visible=$CUDA_VISIBLE_DEVICES uid=$(id -u) \
                 caps=$(grep CapEff /proc/self/status | tr -d '\\t'); echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); \
                 echo host=$(cat /etc/passwd | wc -l) home=$HOME; echo step-1 > $GPUNET_CHECKPOINT_DIR/state; exit 7";
    let id = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--max-restarts", "0", "--", "sh", "-c", probe]);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "failed");
    let log = st.log("c1", id, 0);
    let v = st.view(id);
    assert_eq!(exit_code(&v), Some(7), "{v}\n{log}");
    assert_eq!(v["placement"][0]["node"], "c1", "only a node that runs containers holds it (p1 has more free GPUs)");
    let gpu =
        log.lines().find_map(|l| l.strip_prefix("visible=")).and_then(|r| r.split(' ').next()).unwrap().to_string();
    let devices: Vec<&str> = log.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(devices, [format!("nvidia{gpu}").as_str(), "nvidiactl"], "only its own GPU's node: {log}");
    assert!(log.contains("uid=210000 "), "the tenant's uid: {log}");
    assert!(log.contains("caps=CapEff:0000000000000000"), "no capabilities: {log}");
    assert!(log.contains("pid1=/.gpunet/init -g -- sh -c"), "the init is PID 1: {log}");
    assert!(log.contains("host=1 "), "the image's /etc/passwd, not the node's: {log}");
    // The log stays root's, readable by the tenant's group, as a process task's (the runtime made it the task's).
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(st.dir.path().join(format!("c1/logs/job-{id}/rank-0-attempt-0.log"))).unwrap();
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (0, 210_000, 0o640));
    let ckpt = st.dir.path().join(format!("c1/checkpoints/job-{id}/state"));
    assert_eq!(read(&ckpt), "step-1", "the checkpoint directory is the node's, at the same path");
    st.wait_clean("c1");

    // No command: the image's own, with its PATH and working directory.
    let id = st.s.submit(&["--image", "oci:lay:1", "--gpus", "0"]);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "succeeded");
    assert!(st.log("c1", id, 0).contains("image-default in /work PATH=/bin:/sbin"), "{}", st.log("c1", id, 0));

    // Over its memory limit: reported as OOM.
    let grow = "x=a; while true; do x=\"$x$x\"; done";
    let oom = st.s.submit(&[
        "--image",
        "dir:tiny",
        "--gpus",
        "0",
        "--memory",
        "32Mi",
        "--max-restarts",
        "0",
        "--",
        "sh",
        "-c",
        grow,
    ]);
    wait_for(Duration::from_secs(60), || st.s.job_state(oom) == "failed");
    let v = st.view(oom);
    assert!(v.to_string().contains("exceeding its memory limit (OOM)"), "{v}");

    // Cancel: SIGTERM reaches the task through the init; the container goes.
    let waiter = "trap 'echo got-TERM; exit 0' TERM; echo up; while true; do sleep 0.1; done";
    let c = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--", "sh", "-c", waiter]);
    wait_for(Duration::from_secs(60), || st.log("c1", c, 0).contains("up"));
    assert_eq!(st.containers("c1").len(), 1, "one container while it runs");
    let name = st.containers("c1")[0].0.clone();
    assert!(
        name.starts_with(&format!("gpunet-{}-", st.tag("c1"))) && name.ends_with(&format!("-job-{c}-rank-0-attempt-0")),
        "named after the agent, the job and the attempt: {name}"
    );
    let (ok, _, e) = st.s.cli("admin-secret", &["cancel", &c.to_string()]);
    assert!(ok, "{e}");
    wait_for(Duration::from_secs(60), || st.s.job_state(c) == "cancelled");
    assert!(st.log("c1", c, 0).contains("got-TERM"), "{}", st.log("c1", c, 0));
    st.wait_clean("c1");

    // The Kubernetes Job (a local image instead of nvcr.io): its image, command, args, env, workingDir, an emptyDir
    // and a hostPath the node allows.
    let k8s = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: resnet50\n  namespace: t\nspec:\n  template:\n    spec:\n\
         \x20     restartPolicy: Never\n      containers:\n      - name: trainer\n        image: oci:lay:1\n\
         \x20       command: [sh, -c]\n        args: ['echo in=$(pwd) epochs=$EPOCHS; cat /data/dataset.txt; \
         echo scratch > /scratch/f && cat /scratch/f; touch /data/x 2>/dev/null || echo data-read-only']\n\
         \x20       workingDir: /work\n        env: [{{name: EPOCHS, value: \"90\"}}]\n\
         \x20       resources: {{limits: {{nvidia.com/gpu: 1}}}}\n\
         \x20       volumeMounts: [{{name: data, mountPath: /data, readOnly: true}}, {{name: scratch, mountPath: /scratch}}]\n\
         \x20     volumes: [{{name: data, hostPath: {{path: {}}}}}, {{name: scratch, emptyDir: {{}}}}]\n",
        shared.display()
    );
    let id = submit_yaml(&st.s, st.dir.path(), &k8s);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "succeeded");
    let log = st.log("c1", id, 0);
    for want in ["in=/work epochs=90", "the-dataset", "scratch", "data-read-only"] {
        assert!(log.contains(want), "{want}: {log}");
    }
    assert_eq!(st.view(id)["placement"][0]["node"], "c1");
    // A host path the node does not allow, reached through a symlink planted in an allowed directory.
    std::os::unix::fs::symlink("/etc", shared.join("escape")).unwrap();
    let bad = k8s
        .replace(&format!("path: {}", shared.display()), &format!("path: {}/escape", shared.display()))
        .replace("spec:\n  template:", "spec:\n  backoffLimit: 0\n  template:");
    let id = submit_yaml(&st.s, st.dir.path(), &bad);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "failed");
    let v = st.view(id);
    assert!(v.to_string().contains("is not allowed on this node"), "{v}");
    assert_eq!(v["attempts"][0]["outcome"], "start_failed", "{v}");
    st.wait_clean("c1");
}

/// A preempted container job resumes in a new container from its checkpoint: its step counter goes on.
#[test]
fn a_preempted_container_job_resumes_in_a_new_container_from_its_checkpoint() {
    if !can_run() {
        return;
    }
    let st = setup(&["--policy", "priority", "--preempt-min-run-s", "0"]);
    let _a = st.agent("c2", "1xT4", &[]);
    let train = "cd $GPUNET_CHECKPOINT_DIR; n=$(cat step 2>/dev/null || echo 0); echo resumed-at=$n; \
                 trap 'echo $n > step; echo saved=$n; exit 0' TERM; \
                 while true; do n=$((n+1)); echo $n > step; echo step=$n; sleep 0.1; done";
    let low = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--", "sh", "-c", train]);
    wait_for(Duration::from_secs(60), || st.log("c2", low, 0).contains("step=5"));
    let hi = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--priority", "10", "--", "sh", "-c", "sleep 0.5"]);
    wait_for(Duration::from_secs(60), || st.s.job_state(hi) == "succeeded");
    wait_for(Duration::from_secs(60), || st.log("c2", low, 1).contains("step="));
    let first = st.log("c2", low, 0);
    let saved: u64 = first.lines().find_map(|l| l.strip_prefix("saved=")).expect(&first).parse().unwrap();
    let second = st.log("c2", low, 1);
    let resumed: u64 = second.lines().find_map(|l| l.strip_prefix("resumed-at=")).expect(&second).parse().unwrap();
    assert!(saved >= 5 && resumed == saved, "saved {saved}, resumed at {resumed}");
    let ids: Vec<String> = st.containers("c2").into_iter().map(|c| c.0).collect();
    assert_eq!(
        ids,
        [format!("gpunet-{}-job-{low}-rank-0-attempt-1", st.tag("c2"))],
        "a new container for the new attempt"
    );
    assert_eq!(st.view(low)["preemptions"].as_u64(), Some(1));
    st.cancel_and_clean("c2", low);
}

/// `kill -9` of the agent: the container runs on and is adopted by the next agent (never a second copy); a container
/// whose wrapper died too (nobody could learn its end) is deleted by the next agent before it starts the task the
/// server still assigns it again: one container at a time, never two.
#[test]
fn a_restarted_agent_adopts_its_running_container_or_removes_an_orphaned_one() {
    if !can_run() {
        return;
    }
    let st = setup(&["--restart-backoff-s", "0"]);
    let mut a = st.agent("c3", "1xT4", &[]);
    let tick =
        "echo attempt=$GPUNET_ATTEMPT; while true; do date +%s%N >> $GPUNET_CHECKPOINT_DIR/ticks; sleep 0.1; done";
    let id = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--", "sh", "-c", tick]);
    let ticks = st.dir.path().join(format!("c3/checkpoints/job-{id}/ticks"));
    let count = || read(&ticks).lines().count();
    wait_for(Duration::from_secs(60), || count() >= 3);
    let before = st.containers("c3");
    a.kill9();
    let n = count();
    wait_for(Duration::from_secs(30), || count() > n + 3);
    assert_eq!(st.containers("c3"), before, "the container runs on without its agent");
    let mut a = st.agent("c3", "1xT4", &[]);
    let n = count();
    wait_for(Duration::from_secs(30), || count() > n + 3);
    assert_eq!(st.containers("c3"), before, "adopted: the same container, no second one");
    assert_eq!(st.view(id)["restarts"].as_u64(), Some(0));
    assert_eq!(st.s.job_state(id), "running");

    // Now the agent and the task's wrapper die: the container is an orphan nobody can learn the end of.
    a.kill9();
    let record = st.dir.path().join(format!("c3/running/job-{id}-rank-0-attempt-0"));
    let wrapper = read(&record).split_whitespace().next().unwrap().to_string();
    run(Command::new("kill").args(["-9", &wrapper]));
    let _a = st.agent("c3", "1xT4", &[]);
    wait_for(Duration::from_secs(60), || st.log("c3", id, 0).matches("attempt=0").count() == 2);
    let now = st.containers("c3");
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].0, before[0].0);
    assert_ne!(now[0].1, before[0].1, "the orphan went and a new container runs the task: {now:?} {before:?}");
    st.cancel_and_clean("c3", id);
}

/// A node with a CDI spec for `nvidia.com/gpu` (what `nvidia-ctk cdi generate` writes): a container gets its GPUs as
/// the spec says — its own GPU's device node and the common ones, the driver's library mounted from the node, the
/// spec's environment — and nothing of another GPU's.
#[test]
fn a_cdi_spec_gives_the_container_its_gpu_the_driver_libraries_and_environment() {
    if !can_run() {
        return;
    }
    let st = setup(&[]);
    let dev = fake_devices(st.dir.path());
    let driver = st.dir.path().join("driver");
    std::fs::create_dir_all(&driver).unwrap();
    std::fs::write(driver.join("libcuda.so.1"), "fake-driver-library\n").unwrap();
    // Writable by anyone on the node: only the read-only mount keeps the task from writing it.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(driver.join("libcuda.so.1"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let cdi = st.dir.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let node = |n: &str| format!(r#"{{"path": "/dev/{n}", "hostPath": "{}/{n}"}}"#, dev.display());
    std::fs::write(
        cdi.join("nvidia.json"),
        format!(
            r#"{{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                "devices": [{{"name": "0", "containerEdits": {{"deviceNodes": [{}]}}}},
                            {{"name": "1", "containerEdits": {{"deviceNodes": [{}]}}}}],
                "containerEdits": {{"env": ["NVIDIA_CDI_TEST=yes"], "deviceNodes": [{}],
                    "mounts": [{{"hostPath": "{}/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1",
                                 "options": ["ro", "nosuid", "nodev", "bind"]}}]}}}}"#,
            node("nvidia0"),
            node("nvidia1"),
            node("nvidiactl"),
            driver.display()
        ),
    )
    .unwrap();
    let _a = st.agent("c4", "2xT4", &["--cdi-spec-dir", cdi.to_str().unwrap()]);
    let (_, nodes, _) = st.s.cli("admin-secret", &["nodes", "--output", "json"]);
    assert_eq!(json(&nodes)[0]["labels"]["gpunet.io/cdi"], "true");
    let probe = "ls /dev | grep nvidia | tr '\\n' ' '; echo; echo visible=$CUDA_VISIBLE_DEVICES env=$NVIDIA_CDI_TEST; \
                 cat /usr/lib/libcuda.so.1; echo x > /usr/lib/libcuda.so.1 2>/dev/null || echo lib-read-only";
    let id = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--", "sh", "-c", probe]);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "succeeded");
    let log = st.log("c4", id, 0);
    let gpu =
        log.lines().find_map(|l| l.strip_prefix("visible=")).and_then(|r| r.split(' ').next()).unwrap().to_string();
    let devices: Vec<&str> = log.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(devices, [format!("nvidia{gpu}").as_str(), "nvidiactl"], "{log}");
    for want in ["env=yes", "fake-driver-library", "lib-read-only"] {
        assert!(log.contains(want), "{want}: {log}");
    }
    st.wait_clean("c4");
}

/// The hostile-tenant probe's race on `host_path`: a job that can write in an allowed directory flips a path
/// component between a directory and a symlink to `/` while its other jobs mount that path. Before the fix about one
/// mount in six got the node's root filesystem, read-write; now each either mounts the real directory or fails to
/// start, never anything else.
#[test]
fn a_host_path_swapped_for_a_symlink_after_the_check_never_mounts_anything_else() {
    if !can_run() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let st = setup(&[]);
    let shared = st.dir.path().join("shared");
    let scratch = shared.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let _a = st.agent("c5", "1xT4", &["--allow-host-path", shared.to_str().unwrap()]);
    let spec = |name: &str, host: &Path, path: &str, cmd: &str| {
        format!(
            "name: {name}\ntenant: t\ngpus: 0\nmax_restarts: 0\nimage: dir:tiny\n\
             container: {{mounts: [{{path: {path}, host_path: {}}}]}}\ncommand: [sh, -c, {cmd:?}]\n",
            host.display()
        )
    };
    let racer = submit_yaml(
        &st.s,
        st.dir.path(),
        &spec(
            "racer",
            &scratch,
            "/s",
            "mkdir /s/x; while :; do rmdir /s/x; ln -s / /s/x; usleep 2000; rm /s/x; mkdir /s/x; usleep 2000; done",
        ),
    );
    // The racer runs as the tenant and owns what it makes in the sticky scratch directory.
    wait_for(Duration::from_secs(60), || scratch.join("x").symlink_metadata().is_ok());
    let probe = "if test -e /x/etc/passwd -o -d /x/proc/1; then echo ESCAPED; ls /x; else echo contained; fi";
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(submit_yaml(&st.s, st.dir.path(), &spec(&format!("m{i}"), &scratch.join("x"), "/x", probe)));
        std::thread::sleep(Duration::from_millis(150));
    }
    let mut mounted = 0;
    for id in &ids {
        wait_for(Duration::from_secs(90), || matches!(st.s.job_state(*id).as_str(), "succeeded" | "failed"));
        let log = st.log("c5", *id, 0);
        assert!(!log.contains("ESCAPED"), "job {id} mounted something outside the allowed directory: {log}");
        mounted += usize::from(log.contains("contained"));
    }
    // The others failed to start: at the agent's check (a symlink or nothing there) or at the wrapper's open.
    eprintln!("{mounted} of {} mounts ran with the real directory; the others failed to start", ids.len());
    st.cancel_and_clean("c5", racer);
}

/// `kill -9` of the agent long enough for its node to be declared lost: the server takes the job's attempt back
/// (fenced until the agent returns). The returning agent adopts the container, finds it no longer in its task set
/// and stops it (SIGTERM through the init, its handler runs), and only then does the job run again, in a new
/// container: never two copies at once.
#[test]
fn a_container_the_server_took_back_is_stopped_by_the_returning_agent_before_the_job_runs_again() {
    if !can_run() {
        return;
    }
    let st = setup(&["--node-lost-after-s", "1", "--node-fence-s", "600", "--restart-backoff-s", "0"]);
    let mut a = st.agent("c6", "1xT4", &[]);
    // Times from /proc/uptime (busybox's date has no nanoseconds): one clock for both containers.
    let job = "m=$GPUNET_CHECKPOINT_DIR/marks; a=$GPUNET_ATTEMPT; t() { cut -d' ' -f1 /proc/uptime; }; \
               echo \"start $a $(t)\" >> $m; \
               if [ \"$a\" != 0 ]; then echo \"end $a $(t)\" >> $m; exit 0; fi; \
               trap 'echo got-TERM; echo \"end $a $(t)\" >> $m; exit 0' TERM; \
               while true; do sleep 0.1; done";
    let id = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--", "sh", "-c", job]);
    let marks_file = st.dir.path().join(format!("c6/checkpoints/job-{id}/marks"));
    let mark = |what: &str, attempt: u32| -> Option<f64> {
        read(&marks_file).lines().find_map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            (v.first() == Some(&what) && v.get(1) == Some(&attempt.to_string().as_str())).then(|| v[2].parse().ok())?
        })
    };
    wait_for(Duration::from_secs(60), || mark("start", 0).is_some());
    a.kill9();
    let lost = || {
        let (_, o, _) = st.s.cli("admin-secret", &["nodes", "--output", "json"]);
        json(&o)[0]["state"] == "lost"
    };
    wait_for(Duration::from_secs(30), lost);
    assert_eq!(st.containers("c6").len(), 1, "the container runs on while its node is lost");
    let _a = st.agent("c6", "1xT4", &[]);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "succeeded");
    let old_end = mark("end", 0).expect("the old copy was stopped through its handler");
    let new_start = mark("start", 1).expect("the job ran again");
    assert!(new_start > old_end, "the new attempt started before the old container ended");
    assert!(st.log("c6", id, 0).contains("got-TERM"), "{}", st.log("c6", id, 0));
    st.wait_clean("c6");
}

/// A frozen agent's container task is fenced by its wrapper too (between the signals it passes on): SIGTERM reaches
/// the container's processes through the wrapper's forwarding at the lease's end (the handler runs and the task
/// keeps going), and SIGKILL ends the container when the server gives the task away — while the agent is still
/// frozen.
#[test]
fn a_frozen_agent_s_container_is_stopped_by_its_wrapper_when_the_lease_runs_out() {
    if !can_run() {
        return;
    }
    let st = setup(&["--node-lost-after-s", "1", "--node-fence-s", "4", "--restart-backoff-s", "0"]);
    let a = st.agent("c7", "1xT4", &[]);
    let job = "trap 'echo got-TERM' TERM; echo started; while true; do sleep 0.1; done";
    let id = st.s.submit(&["--image", "dir:tiny", "--gpus", "1", "--max-restarts", "0", "--", "sh", "-c", job]);
    wait_for(Duration::from_secs(60), || st.log("c7", id, 0).contains("started"));
    let frozen = Frozen::stop(a.0.id());
    let status = st.dir.path().join(format!("c7/running/job-{id}-rank-0-attempt-0.status"));
    wait_for(Duration::from_secs(60), || read(&status) == "signal 9");
    let out = st.log("c7", id, 0);
    assert!(out.contains("got-TERM") && out.contains("(fencing)"), "{out}");
    assert!(frozen.still_stopped(), "the agent was frozen all along");
    assert!(st.containers("c7").iter().all(|(_, status)| !status.starts_with("running")), "{:?}", st.containers("c7"));
}

/// A container task's liveness probe runs in its container (`runc exec`): it sees the container's private `/tmp`,
/// where the task keeps its heartbeat. The probe passes while the file is there (on the node it would fail at once)
/// and fails once the task removes it.
#[test]
fn a_container_task_s_liveness_probe_runs_in_its_container() {
    if !can_run() {
        return;
    }
    let st = setup(&[]);
    let _a = st.agent("c7", "1xT4", &[]);
    let yaml = "name: probed\ntenant: t\ngpus: 0\nmax_restarts: 0\nimage: dir:tiny\n\
                command: [sh, -c, 'touch /tmp/ok; echo up; sleep 4; rm /tmp/ok; echo removed; sleep 60']\n\
                liveness: {command: [sh, -c, 'test -e /tmp/ok'], initial_delay: 1s, period: 1s}\n";
    let id = submit_yaml(&st.s, st.dir.path(), yaml);
    wait_for(Duration::from_secs(60), || st.s.job_state(id) == "failed");
    let v = st.view(id);
    let a = &v["attempts"][0];
    assert_eq!(a["outcome"], "liveness", "{v}");
    assert!(st.log("c7", id, 0).contains("removed"), "the probe passed until the file went: {}", st.log("c7", id, 0));
    let ran = a["ended_ms"].as_u64().unwrap() - a["started_ms"].as_u64().unwrap();
    assert!(ran >= 4000, "failed after {ran} ms: before the task removed its file");
    st.wait_clean("c7");
}

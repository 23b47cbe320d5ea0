//! [`ClusterState::check_invariants`]: every invariant the state's methods keep, checked from scratch (tests,
//! property tests and the simulator's debug builds call it).

use super::*;

impl ClusterState {
    /// Checks every invariant: no resource allocated twice or beyond capacity, gangs whole, topology met, usage
    /// books match running jobs, every job in exactly one place, quota limits respected.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.free.check(&self.topo)?;
        if !self.pass_pool.agrees_with(&self.free) {
            return Err("the passes' copy of the free pool differs from the pool".into());
        }
        // A job being moved (defragmentation) is stopping, or queued with the first claim.
        for id in self.moving.keys() {
            let j = self.jobs.get(id).ok_or_else(|| format!("moving {id} is no job"))?;
            let stopping = j.state == JobState::Running && self.evicting.contains(id);
            let claiming = j.state.is_queued() && !j.held && self.preempting_for.contains(id);
            if !stopping && !claiming {
                return Err(format!("moving {id} is {} and neither stopping nor first in line", j.state));
            }
        }
        for id in self.moving_for.keys() {
            let j = self.jobs.get(id).ok_or_else(|| format!("moved for {id}, no job"))?;
            if !j.state.is_queued() || j.held || !self.preempting_for.contains(id) {
                return Err(format!("jobs were moved for {id}, which is {} and not first in line", j.state));
            }
        }
        let n = self.node_specs.len();
        let mut used_mask = vec![0u64; n];
        let mut used_cpu = vec![0u64; n];
        let mut used_mem = vec![0u64; n];
        let mut usage = vec![[0u64; QDIMS]; self.tenants.len()];
        let mut queued = 0usize;
        let mut in_queue: HashMap<JobId, usize> = HashMap::new();
        for (i, t) in self.tenants.iter().enumerate() {
            for k in t.queue.iter().chain(&t.parked) {
                *in_queue.entry(k.job).or_default() += 1;
                // Found by its order's fields alone (`queue_probe`), a key must carry the rest as the job has them.
                let j = self.jobs.get(&k.job).ok_or_else(|| format!("a queued key names {}, no job", k.job))?;
                if !k.same_fields(&queue_key(&self.cfg, j)) {
                    return Err(format!("the queued key of {} is not the one its job makes now: {k:?}", k.job));
                }
            }
            // The merged queue's copy of each key is the one the pass reads (its GPUs, estimate, backoff, shape):
            // all its fields, not only those it is found by.
            for k in &t.queue {
                match self.merged.get(&(*k, TenantId(i as u32))) {
                    None => return Err(format!("a queued job of tenant {i} is missing from the merged queue")),
                    Some((m, _)) if !m.same_fields(k) => {
                        return Err(format!("the merged queue's key of {} differs from its tenant's: {m:?}", k.job))
                    }
                    Some(_) => {}
                }
            }
        }
        let in_queues: usize = self.tenants.iter().map(|t| t.queue.len()).sum();
        if self.merged.len() != in_queues {
            return Err(format!("the merged queue holds {} keys, the tenants' queues {in_queues}", self.merged.len()));
        }
        self.queue_shapes.check(self.tenants.iter().flat_map(|t| &t.queue))?;
        for j in self.jobs.values() {
            let q = in_queue.get(&j.id).copied().unwrap_or(0);
            if self.held.contains(&j.id) != j.held {
                return Err(format!("{} is marked held {} but the held set says {}", j.id, j.held, !j.held));
            }
            if j.held {
                if !j.state.is_queued() || q != 0 || self.dep_waiting.contains(&j.id) {
                    return Err(format!("{} is held but is {} in {q} queues", j.id, j.state));
                }
            } else if self.dep_waiting.contains(&j.id) {
                if j.state != JobState::Pending || q != 0 {
                    return Err(format!("{} waits for dependencies but is {} in {q} queues", j.id, j.state));
                }
            } else if j.state.is_queued() {
                queued += 1;
                if q != 1 {
                    return Err(format!("{} is {} but sits in {q} queues", j.id, j.state));
                }
                if j.run.is_some() {
                    return Err(format!("{} is {} but holds resources", j.id, j.state));
                }
            } else if q != 0 {
                return Err(format!("{} is {} but sits in a queue", j.id, j.state));
            }
            match (&j.run, j.state) {
                (Some(r), JobState::Running) => {
                    match self.running_by_end.get(&(Self::est_end(j, r.started), j.id)) {
                        None => return Err(format!("{} is running but not in the running index", j.id)),
                        Some(tasks) if tasks[..] != r.placement.tasks[..] => {
                            return Err(format!("{}: the running index holds other tasks than its run", j.id))
                        }
                        Some(_) => {}
                    }
                    let (min, max) =
                        j.spec.elastic.map_or((j.spec.tasks, j.spec.tasks), |e| (e.min_tasks, e.max_tasks));
                    let nt = r.placement.tasks.len() as u32;
                    if nt < min || nt > max {
                        return Err(format!("{} runs {nt} tasks, gang needs {min}..={max}", j.id));
                    }
                    if !self.scope_met(j.spec.topology, &r.placement) {
                        return Err(format!("{} is not within {}", j.id, j.spec.topology));
                    }
                    let mut models = BTreeSet::new();
                    for t in &r.placement.tasks {
                        let i = t.node.index();
                        if used_mask[i] & t.gpu_mask != 0 {
                            return Err(format!("GPU {:#x} of {} allocated twice", used_mask[i] & t.gpu_mask, t.node));
                        }
                        used_mask[i] |= t.gpu_mask;
                        used_cpu[i] += t.cpu.0;
                        used_mem[i] += t.mem.0;
                        if t.gpu_mask != 0 {
                            models.insert(self.node_specs[i].gpu_model());
                        }
                        if !self.node_jobs[i].contains(&j.id) {
                            return Err(format!("{} runs on {} but the node does not list it", j.id, t.node));
                        }
                    }
                    if models.len() > 1 && !j.spec.allow_mixed_models {
                        return Err(format!("{} spans GPU models", j.id));
                    }
                    let qv = self.placement_qvec(&j.spec, &r.placement);
                    for d in 0..QDIMS {
                        usage[j.spec.tenant.index()][d] += qv[d];
                    }
                }
                (None, JobState::Running) => return Err(format!("{} is running without a placement", j.id)),
                (Some(_), s) => return Err(format!("{} is {s} but holds a placement", j.id)),
                (None, _) => {}
            }
        }
        if queued != self.queued {
            return Err(format!("queued count {} but {queued} jobs are queued", self.queued));
        }
        for (i, t) in self.tenants.iter().enumerate() {
            let mut real = crate::park::Waiting::default();
            t.queue.iter().chain(&t.parked).for_each(|k| real.add(k));
            if real != t.waiting {
                return Err(format!("tenant-{i}: its queue holds {real:?} but {:?} is kept", t.waiting));
            }
        }
        let running = self.jobs.values().filter(|j| j.state == JobState::Running).count();
        let rows_ok = (0..2)
            .all(|p| self.run_rows[p].iter().enumerate().all(|(i, r)| self.run_row_of.get(&r.id) == Some(&(p, i))));
        let counted: u32 = self.prio_counts.values().sum();
        let by_tenant: crate::chunked::ChunkedMap<(TenantId, i32, Time, JobId), RunBrief> = (0..2)
            .flat_map(|p| {
                self.run_rows[p].iter().enumerate().map(move |(i, r)| (r.tenant_key(), RunBrief::of(r, (p, i))))
            })
            .collect();
        if running != self.run_rows[0].len() + self.run_rows[1].len()
            || !rows_ok
            || counted as usize != running
            || by_tenant != self.tenant_runs
        {
            return Err("running rows out of sync".into());
        }
        // A row's GPUs, classes and node are its job's placement's (an elastic job that grew included).
        for r in self.run_rows.iter().flatten() {
            let tasks =
                &self.jobs[&r.id].run.as_ref().ok_or_else(|| format!("{} has a row and no run", r.id))?.placement.tasks;
            if (r.gpus, r.classes, r.node) != placement_summary(&self.topo, tasks) {
                return Err(format!("{}'s running row does not match its placement", r.id));
            }
        }
        if running != self.running_by_end.len() {
            return Err(format!("{running} running jobs but {} in the running index", self.running_by_end.len()));
        }
        for i in 0..n {
            let t = &self.topo.nodes[i];
            let f = &self.free.nodes[i];
            if used_mask[i] & f.mask != 0 {
                return Err(format!("node-{i}: a GPU is both free and allocated"));
            }
            if (used_mask[i] | f.mask) & t.gpu_mask != t.gpu_mask && t.present {
                return Err(format!("node-{i}: a GPU is neither free nor allocated"));
            }
            if used_cpu[i] + f.cpu.0 != t.cpu.0 || used_mem[i] + f.mem.0 != t.mem.0 {
                return Err(format!("node-{i}: CPU or memory over-allocated or leaked"));
            }
        }
        for (i, u) in usage.iter().enumerate() {
            if *u != self.book.usage[i] {
                return Err(format!("tenant-{i}: usage book {:?} but running jobs hold {:?}", self.book.usage[i], u));
            }
        }
        for (t, n) in &self.dep_waiting_per_tenant {
            let real = self.dep_waiting.iter().filter(|j| self.jobs[*j].spec.tenant == *t).count();
            if real != *n {
                return Err(format!("{t}: {real} jobs wait for dependencies, counted {n}"));
            }
        }
        for (t, n) in &self.held_per_tenant {
            let real = self.held.iter().filter(|j| self.jobs[*j].spec.tenant == *t).count();
            if real != *n {
                return Err(format!("{t}: {real} jobs held, counted {n}"));
            }
        }
        self.check_parking()?;
        self.check_arrays()
    }
}

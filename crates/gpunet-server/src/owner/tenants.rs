//! The owner's tenant commands: tenants (create, list), quotas (set, and the conversion of the API's quota into the
//! core's) and tokens (issue, create, list, revoke).

use super::{not_found, valid_name, Owner, Reply, TenantDoc, Which};
use crate::now_ms;
use crate::tokens::TokenDoc;
use crate::Principal;
use gpunet_api::types::*;
use gpunet_api::ApiError;
use gpunet_core::tenant::{dim_model, Quota, DIM_CPU, DIM_GPUS, DIM_MEM};
use gpunet_core::{GpuModel, JobState, TenantId, TenantSpec, Time};
use gpunet_store::Write;

/// Converts an API quota into the core's.
pub(crate) fn quota_from_request(q: &QuotaRequest) -> Result<Quota, ApiError> {
    let mut out = Quota::default();
    let gpus = |f: &str, v: Option<u64>| match v {
        Some(g) if g > gpunet_api::units::MAX_GPUS => Err(ApiError::invalid(f, &g.to_string(), "0 to 1000000 GPUs")),
        _ => Ok(()),
    };
    gpus("guarantee_gpus", q.guarantee_gpus)?;
    gpus("limit_gpus", q.limit_gpus)?;
    for (m, g) in &q.per_model_gpus {
        gpus(&format!("per_model_gpus.{m}"), Some(*g))?;
    }
    if let Some(g) = q.guarantee_gpus {
        out = out.with(DIM_GPUS, g, q.limit_gpus.unwrap_or(g));
    } else if let Some(l) = q.limit_gpus {
        out = out.with(DIM_GPUS, 0, l);
    }
    let cpu = |f: &str, v: &Option<String>| v.as_deref().map(|s| gpunet_api::units::parse_cpu(f, s)).transpose();
    let mem = |f: &str, v: &Option<String>| v.as_deref().map(|s| gpunet_api::units::parse_memory(f, s)).transpose();
    let (gc, lc) = (cpu("guarantee_cpu", &q.guarantee_cpu)?, cpu("limit_cpu", &q.limit_cpu)?);
    if gc.is_some() || lc.is_some() {
        let g = gc.unwrap_or_default();
        out = out.with(DIM_CPU, g.0, lc.unwrap_or(g).0.max(if lc.is_none() { g.0 } else { 0 }));
    }
    let (gm, lm) = (mem("guarantee_memory", &q.guarantee_memory)?, mem("limit_memory", &q.limit_memory)?);
    if gm.is_some() || lm.is_some() {
        let g = gm.unwrap_or_default();
        out = out.with(DIM_MEM, g.0, lm.unwrap_or(g).0);
    }
    for (m, g) in &q.per_model_gpus {
        let model: GpuModel = m.parse().map_err(|_| {
            ApiError::invalid(&format!("per_model_gpus.{m}"), m, &GpuModel::ALL.map(|m| m.name()).join(", "))
        })?;
        out = out.with(dim_model(model), *g, *g);
    }
    out.validate()?;
    Ok(out)
}

impl Owner {
    /// Creates a tenant and its first token (which administers the tenant).
    pub(super) fn create_tenant(&mut self, req: TenantRequest, reply: Reply<TokenIssued>) {
        let r = (|| {
            valid_name("name", &req.name)?;
            if let Some(c) = &req.cohort {
                valid_name("cohort", c)?;
            }
            let mut spec = TenantSpec::new(req.name.clone());
            spec.weight = req.weight.unwrap_or(1.0);
            if !(spec.weight > 0.0 && spec.weight <= 1e6) {
                return Err(ApiError::invalid("weight", &spec.weight.to_string(), "a number > 0 and <= 1000000"));
            }
            spec.cohort = req.cohort.clone();
            spec.quota = req.quota.as_ref().map(quota_from_request).transpose()?;
            self.st.add_tenant(spec.clone())?;
            Ok(spec)
        })();
        match r {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok(spec) => {
                // The tenant's first token administers the tenant (its jobs and tokens).
                let (token, mut writes) = self.new_token(TokenDoc {
                    role: TokenRole::TenantAdmin,
                    tenant: Some(req.name.clone()),
                    user: None,
                    created_ms: now_ms(),
                    expires_ms: None,
                    bootstrap: false,
                });
                let doc = TenantDoc { spec, quota: req.quota.clone(), usage: None, spot: req.spot };
                writes.push(Write::Tenant {
                    name: req.name.clone(),
                    doc: serde_json::to_value(&doc).expect("serialise"),
                });
                self.tenants.insert(req.name.clone(), doc);
                self.dirty = true;
                self.durable(writes, reply, TokenIssued { tenant: req.name, token });
            }
        }
    }

    /// Sets or removes a tenant's quota.
    pub(super) fn set_quota(&mut self, tenant: String, quota: Option<(Quota, QuotaRequest)>, reply: Reply<TenantView>) {
        let r = (|| {
            let id = self.tenant_id(&tenant)?;
            self.st.set_quota(id, quota.as_ref().map(|q| q.0.clone()))?;
            Ok(())
        })();
        if let Err(e) = r {
            let _ = reply.send(Err(e));
            return;
        }
        let doc = self.tenants.get_mut(&tenant).expect("tenant exists");
        doc.spec.quota = quota.as_ref().map(|q| q.0.clone());
        doc.quota = quota.map(|q| q.1);
        let w = Write::Tenant { name: tenant.clone(), doc: serde_json::to_value(&*doc).expect("serialise") };
        self.dirty = true;
        let v = self.tenant_view(&tenant).expect("exists");
        self.durable(vec![w], reply, v);
    }

    /// A new tenant token.
    pub(super) fn issue_token(&mut self, tenant: String, reply: Reply<TokenIssued>) {
        if !self.tenants.contains_key(&tenant) {
            let _ = reply.send(Err(not_found("tenant", &tenant)));
            return;
        }
        let (token, writes) = self.new_token(TokenDoc {
            role: TokenRole::Tenant,
            tenant: Some(tenant.clone()),
            user: None,
            created_ms: now_ms(),
            expires_ms: None,
            bootstrap: false,
        });
        self.durable(writes, reply, TokenIssued { tenant, token });
    }

    /// A new token of any role.
    pub(super) fn create_token(&mut self, doc: TokenDoc, reply: Reply<TokenCreated>) {
        if let Some(t) = doc.tenant.as_ref().filter(|t| !self.tenants.contains_key(*t)) {
            let _ = reply.send(Err(not_found("tenant", t)));
            return;
        }
        let (token, writes) = self.new_token(doc.clone());
        let info = crate::tokens::info(&crate::hash_token(&token), &crate::tokens::Cred::of(doc));
        self.durable(writes, reply, TokenCreated { info, token });
    }

    /// Tokens (not nodes' credentials), of one tenant when given, oldest first.
    pub(super) fn list_tokens(&mut self, tenant: Option<String>, reply: Reply<Vec<TokenInfo>>) {
        let a = self.auth.read().expect("auth lock");
        let mut v: Vec<TokenInfo> = a
            .iter()
            .filter(|(_, c)| !matches!(c.who, Principal::Node(_)))
            .map(|(h, c)| crate::tokens::info(h, c))
            .filter(|i| tenant.is_none() || i.tenant == tenant)
            .collect();
        v.sort_by(|x, y| (x.created_ms, &x.id).cmp(&(y.created_ms, &y.id)));
        let _ = reply.send(Ok(v));
    }

    /// Revokes a token by id (only one of `tenant`'s, when given); never the last admin token.
    pub(super) fn revoke_token(&mut self, id: String, tenant: Option<String>, reply: Reply<TokenInfo>) {
        let r = (|| {
            let a = self.auth.read().expect("auth lock");
            let found: Vec<(&String, &crate::tokens::Cred)> = a
                .iter()
                .filter(|(h, c)| crate::tokens::id_of(h) == id && !matches!(c.who, Principal::Node(_)))
                .collect();
            let [(hash, cred)] = found[..] else { return Err(not_found("token", &id)) };
            let info = crate::tokens::info(hash, cred);
            if tenant.is_some() && info.tenant != tenant {
                return Err(not_found("token", &id));
            }
            let admins = a.values().filter(|c| c.who == Principal::Admin).count();
            if cred.who == Principal::Admin && admins == 1 {
                return Err(ApiError::new("conflict", "revoke the last admin token: create another first"));
            }
            Ok((hash.clone(), info))
        })();
        match r {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok((hash, info)) => {
                self.auth.write().expect("auth lock").remove(&hash);
                self.durable(vec![Write::RevokeToken { hash }], reply, info);
            }
        }
    }

    /// The tenants `who` may see.
    pub(super) fn list_tenants(&mut self, who: Principal, reply: Reply<Vec<TenantView>>) {
        let v = self
            .tenants
            .keys()
            .filter(|n| match &who {
                Principal::Tenant(t) => *t == **n,
                _ => true,
            })
            .filter_map(|n| self.tenant_view(n))
            .collect();
        let _ = reply.send(Ok(v));
    }

    /// A new token for `doc`: usable at once; returns the secret and the writes that store its hash and record.
    fn new_token(&self, doc: TokenDoc) -> (String, Vec<Write>) {
        let token = crate::new_token();
        let hash = crate::hash_token(&token);
        let writes = crate::tokens::writes(&hash, &doc);
        self.auth.write().expect("auth lock").insert(hash, crate::tokens::Cred::of(doc));
        (token, writes)
    }

    pub(super) fn tenant_id(&self, name: &str) -> Result<TenantId, ApiError> {
        self.st.tenant_id(name).ok_or_else(|| not_found("tenant", name))
    }

    fn tenant_view(&self, name: &str) -> Option<TenantView> {
        let d = self.tenants.get(name)?;
        let id = self.st.tenant_id(name)?;
        let u = self.st.tenant_usage(id);
        let count = |states: &[JobState]| self.docs.count(Which { tenant: Some(name), states, ..Which::default() });
        let (queued, running) = (count(&super::doc::QUEUED), count(&[JobState::Running]));
        Some(TenantView {
            name: name.to_string(),
            weight: d.spec.weight,
            cohort: d.spec.cohort.clone(),
            quota: d.quota.clone(),
            gpus_used: u.gpus as u64,
            cpu_milli_used: u.cpu.0,
            memory_mib_used: u.mem.0,
            queued,
            running,
            fair_share_usage_gpu_hours: self.st.tenant_decayed_usage_gpu_s(id, Time(now_ms())) / 3600.0,
            spot: d.spot,
        })
    }
}

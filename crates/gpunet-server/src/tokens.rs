//! Bearer tokens: only their SHA-256 hashes are kept, each with a record (role, tenant, user, creation, expiry). The
//! admin and join tokens given at start (`--admin-token`, `--join-token`) are *bootstrap* tokens: a start with a
//! different one revokes the old, so rotating them takes one restart; tokens made through `POST /v1/tokens` (any role,
//! for a named user) stay until revoked or expired, so rotation without downtime is create, switch, revoke.

use crate::Principal;
use gpunet_api::types::{TokenInfo, TokenRole};
use gpunet_store::Write;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A token's stored record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenDoc {
    /// Role.
    pub role: TokenRole,
    /// Tenant of `tenant` and `tenant-admin` tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Who holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Created, ms since the Unix epoch.
    pub created_ms: u64,
    /// Expiry, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// Given at start (`--admin-token`, `--join-token`, or generated): replaced by the next one given.
    #[serde(default)]
    pub bootstrap: bool,
}

/// What a bearer token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// The principal.
    pub who: Principal,
    /// The record; `None` for node credentials and tokens stored before records.
    pub doc: Option<TokenDoc>,
}

impl Cred {
    /// The credential of a record.
    pub fn of(doc: TokenDoc) -> Cred {
        let who = match (doc.role, &doc.tenant) {
            (TokenRole::Admin, _) => Principal::Admin,
            (TokenRole::Join, _) => Principal::Agent,
            (_, t) => Principal::Tenant(t.clone().unwrap_or_default()),
        };
        Cred { who, doc: Some(doc) }
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.doc.as_ref().and_then(|d| d.expires_ms).is_some_and(|e| e <= now_ms)
    }

    /// Whether it manages its tenant's tokens.
    pub fn tenant_admin(&self) -> bool {
        self.doc.as_ref().is_some_and(|d| d.role == TokenRole::TenantAdmin)
    }

    /// The name recorded on the jobs it submits: the user, else the role.
    pub fn submitter(&self) -> String {
        match (&self.doc, &self.who) {
            (Some(TokenDoc { user: Some(u), .. }), _) => u.clone(),
            (Some(d), _) => d.role.as_str().to_string(),
            (None, Principal::Admin) => "admin".into(),
            (None, _) => "tenant".into(),
        }
    }

    /// The role of a token without a record.
    fn role(&self) -> TokenRole {
        match (&self.doc, &self.who) {
            (Some(d), _) => d.role,
            (None, Principal::Admin) => TokenRole::Admin,
            (None, Principal::Agent | Principal::Node(_)) => TokenRole::Join,
            (None, Principal::Tenant(_)) => TokenRole::Tenant,
        }
    }
}

/// Token hashes and what they stand for.
pub type Auth = Arc<RwLock<HashMap<String, Cred>>>;

/// A token's id: the start of its hash.
pub fn id_of(hash: &str) -> String {
    hash.chars().take(16).collect()
}

/// How a token is listed.
pub fn info(hash: &str, c: &Cred) -> TokenInfo {
    let d = c.doc.as_ref();
    TokenInfo {
        id: id_of(hash),
        role: c.role(),
        tenant: d.and_then(|d| d.tenant.clone()).or(match &c.who {
            Principal::Tenant(t) => Some(t.clone()),
            _ => None,
        }),
        user: d.and_then(|d| d.user.clone()),
        created_ms: d.map_or(0, |d| d.created_ms),
        expires_ms: d.and_then(|d| d.expires_ms),
    }
}

/// The writes that store a token.
pub fn writes(hash: &str, doc: &TokenDoc) -> Vec<Write> {
    // The token row carries the role too (stored, never inferred from a name); the record adds user and expiry.
    let (role, tenant) = match doc.role {
        TokenRole::Admin => (gpunet_store::TokenRole::Admin, None),
        TokenRole::Join => (gpunet_store::TokenRole::Agent, None),
        TokenRole::TenantAdmin | TokenRole::Tenant => (gpunet_store::TokenRole::Tenant, doc.tenant.clone()),
    };
    vec![
        Write::Token { hash: hash.to_string(), role, tenant },
        Write::TokenDoc { hash: hash.to_string(), doc: serde_json::to_value(doc).expect("token records serialise") },
    ]
}

/// Makes `token` the bootstrap token of `role` (admin or join): every other bootstrap token of that role, and every
/// token of that role stored before records, is revoked. Returns the writes.
pub fn bootstrap(auth: &Auth, role: TokenRole, token: &str, now_ms: u64) -> Vec<Write> {
    let hash = crate::hash_token(token);
    let mut a = auth.write().expect("auth lock");
    let old: Vec<String> = a
        .iter()
        .filter(|(h, c)| {
            **h != hash
                && c.role() == role
                && !matches!(c.who, Principal::Node(_))
                && c.doc.as_ref().is_none_or(|d| d.bootstrap)
        })
        .map(|(h, _)| h.clone())
        .collect();
    let mut out = Vec::new();
    for h in old {
        tracing::info!(token = %id_of(&h), role = role.as_str(), "bootstrap token replaced; the old one is revoked");
        a.remove(&h);
        out.push(Write::RevokeToken { hash: h });
    }
    if a.get(&hash).is_none_or(|c| c.doc.is_none()) {
        let doc = TokenDoc {
            role,
            tenant: None,
            user: Some(role.as_str().into()),
            created_ms: now_ms,
            expires_ms: None,
            bootstrap: true,
        };
        out.extend(writes(&hash, &doc));
        a.insert(hash, Cred::of(doc));
    }
    out
}

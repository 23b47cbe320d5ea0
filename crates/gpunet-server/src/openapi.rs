//! The OpenAPI 3.1 document served at `/v1/openapi.json`, generated with `utoipa` from the wire types of
//! `gpunet-api` (each derives `ToSchema`; their doc comments are the descriptions) and the `#[utoipa::path]`
//! annotations of the handlers in [`crate::http`]: every body, parameter and status. Every operation also lists the
//! error statuses any request may meet (the token, the body's size and syntax, limits, a read-only store), each with
//! the error body. A committed copy (`openapi.json` at the repository root) is checked against it by a test, so API
//! changes show up in review.

use crate::http::*;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

/// The statuses of errors, each with when it happens; every operation documents them (`ErrorBody`).
const ERRORS: &[(&str, &str)] = &[
    ("400", "The body cannot be parsed (`parse_error`)"),
    ("401", "No token, or an unknown, expired or revoked one (`unauthorized`)"),
    ("403", "The token may not do this (`forbidden`)"),
    ("404", "No such job, tenant, token, node or route, or another tenant's (`not_found`)"),
    ("409", "The change conflicts with the state (`conflict`)"),
    ("413", "The body is larger than the route accepts (`too_large`)"),
    ("422", "A field is invalid, unknown or missing; `field` names it"),
    ("429", "A per-tenant or per-token limit is reached (`limit_exceeded`)"),
    ("500", "The store failed (`internal`)"),
    ("503", "Unavailable (`unavailable`, with `Retry-After`): the store refused an earlier write (read-only until restarted; on PostgreSQL the leader gives the lead up), or no leader serves yet; or `interrupted` (header `Gpunet-Outcome: unknown`): the control loop ended before answering (a leader stepping down), or the store refused this change's write, so whether a change was made is not known — `Retry-After` only on a request that is safe to send again (a read, or a submission with an `Idempotency-Key`)"),
];

#[derive(OpenApi)]
#[openapi(
    info(title = "gpunet", version = "v1", description = "The gpunet control-plane API. Every request but \
        /v1/health and /v1/openapi.json carries a bearer token. Errors are {\"error\": {\"code\", \"message\", \
        \"field\"}}."),
    paths(
        submit, submit_batch, dry_run, list_jobs, get_job, cancel_job, hold_job, release_job, job_events, explain_job, job_logs,
        create_tenant, list_tenants, set_quota, issue_token, list_tokens, create_token, revoke_token,
        register_node, list_nodes, node_action, list_pools, agent_sync, cluster, history, queue_view, whoami, usage, events,
        metrics, health, openapi
    ),
    components(schemas(gpunet_api::ErrorBody, gpunet_api::ApiError)),
    modifiers(&Conventions),
    tags(
        (name = "jobs", description = "Submit, list, inspect and cancel jobs"),
        (name = "tenants", description = "Tenants, quotas and their tokens"),
        (name = "tokens", description = "Per-user tokens"),
        (name = "nodes", description = "Nodes and their agents' registration"),
        (name = "agents", description = "Agents' sync (node credentials)"),
        (name = "cluster", description = "Cluster state, usage, events, metrics and health")
    )
)]
struct ApiDoc;

/// Bearer authentication on every operation (but those that say `security(())`), and the error responses.
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new())]);
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.put, &mut item.post, &mut item.delete].into_iter().flatten() {
                let public = op.security.as_ref().is_some_and(|s| s.iter().all(|r| *r == Default::default()));
                for (status, when) in ERRORS {
                    if public && *status != "503" {
                        continue;
                    }
                    op.responses.responses.entry(status.to_string()).or_insert_with(|| {
                        RefOr::T(
                            ResponseBuilder::new()
                                .description(*when)
                                .content(
                                    "application/json",
                                    utoipa::openapi::ContentBuilder::new()
                                        .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                                        .build(),
                                )
                                .build(),
                        )
                    });
                }
            }
        }
    }
}

/// The document.
pub fn document() -> Value {
    serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serialises")
}

//! The OpenAPI 3 document served at `/v1/openapi.json`. A committed copy (`openapi.json` at the repository root) is
//! checked against it by a test, so API changes show up in review.

use serde_json::{json, Value};

/// A submission that takes an `Idempotency-Key`.
fn idempotent(mut o: Value) -> Value {
    o["parameters"] = json!([{"name": "Idempotency-Key", "in": "header", "required": false,
        "description": "1 to 255 visible ASCII characters; a retry with the same key (from the same submitter) gets the jobs the first try made",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255}}]);
    o["responses"]["200"] = json!({"description": "a replay (header Idempotent-Replayed: true): the jobs an earlier try with this key made", "content": {"application/json": {}}});
    o["responses"]["409"] = json!({"$ref": "#/components/responses/Error"});
    o
}

fn op(summary: &str, tag: &str, body: Option<&str>, ok: (&str, &str)) -> Value {
    let mut o = json!({
        "summary": summary,
        "tags": [tag],
        "security": [{"bearer": []}],
        "responses": {
            ok.0: {"description": ok.1, "content": {"application/json": {}}},
            "400": {"$ref": "#/components/responses/Error"},
            "401": {"$ref": "#/components/responses/Error"},
            "403": {"$ref": "#/components/responses/Error"},
            "404": {"$ref": "#/components/responses/Error"},
            "413": {"$ref": "#/components/responses/Error"},
            "422": {"$ref": "#/components/responses/Error"},
            "429": {"$ref": "#/components/responses/Error"}
        }
    });
    if let Some(b) = body {
        o["requestBody"] = json!({"required": true, "description": b,
            "content": {"application/json": {}, "application/yaml": {}}});
    }
    o
}

fn id_param() -> Value {
    json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}, "description": "42 or job-42"}])
}

/// The document.
pub fn document() -> Value {
    let job_spec = "A gpunet job spec (YAML or JSON) or a Kubernetes batch/v1 Job";
    json!({
        "openapi": "3.0.3",
        "info": {"title": "gpunet", "version": "v1",
                 "description": "The gpunet control-plane API. Errors are {\"error\": {\"code\", \"message\", \"field\"}}."},
        "paths": {
            "/v1/jobs": {
                "post": idempotent(op("Submit a job (durable when acknowledged)", "jobs", Some(job_spec), ("201", "Submitted"))),
                "get": {
                    "parameters": [
                        {"name": "tenant", "in": "query", "schema": {"type": "string"}},
                        {"name": "state", "in": "query", "schema": {"type": "string",
                            "enum": ["pending", "running", "preempted", "restarting", "succeeded", "failed", "cancelled"]}},
                        {"name": "after", "in": "query", "schema": {"type": "integer"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}
                    ],
                    "summary": "List jobs (a tenant sees its own)", "tags": ["jobs"], "security": [{"bearer": []}],
                    "responses": {"200": {"description": "JobPage", "content": {"application/json": {}}},
                                  "401": {"$ref": "#/components/responses/Error"},
                                  "422": {"$ref": "#/components/responses/Error"}}
                }
            },
            "/v1/jobs/batch": {"post": idempotent(op("Submit up to 10000 jobs at once", "jobs", Some("A JSON array of job specs"), ("201", "Submitted[]")))},
            "/v1/jobs/dry-run": {"post": op("Placement and ETA without queuing", "jobs", Some(job_spec), ("200", "DryRun"))},
            "/v1/jobs/{id}": {"get": op("A job", "jobs", None, ("200", "JobView")), "parameters": id_param()},
            "/v1/jobs/{id}/cancel": {"post": op("Cancel a job", "jobs", None, ("200", "JobView")), "parameters": id_param()},
            "/v1/jobs/{id}/events": {"get": op("A job's events", "jobs", None, ("200", "EventRow[]")), "parameters": id_param()},
            "/v1/jobs/{id}/explain": {"get": op("Why a job is pending, with numbers and an ETA", "jobs", None, ("200", "Explain")), "parameters": id_param()},
            "/v1/jobs/{id}/logs": {"get": op("A rank's log (latest attempt); follow=true streams until the job ends", "jobs", None, ("200", "text/plain")),
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
                               {"name": "rank", "in": "query", "schema": {"type": "integer"}},
                               {"name": "follow", "in": "query", "schema": {"type": "boolean"}}]},
            "/v1/tenants": {
                "post": op("Create a tenant (admin); returns its first token", "tenants", Some("TenantRequest"), ("201", "TokenIssued")),
                "get": op("Tenants with quota use (a tenant sees itself)", "tenants", None, ("200", "TenantView[]"))
            },
            "/v1/tenants/{name}/quota": {"put": op("Set a tenant's quota (admin): QuotaRequest or a v1 ResourceQuota", "tenants", Some("QuotaRequest or ResourceQuota"), ("200", "TenantView")),
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]},
            "/v1/tenants/{name}/tokens": {"post": op("Issue another token for a tenant (admin)", "tenants", None, ("201", "TokenIssued")),
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]},
            "/v1/tokens": {
                "get": {
                    "parameters": [{"name": "tenant", "in": "query", "schema": {"type": "string"}}],
                    "summary": "Tokens, never their secrets (admin: all; a tenant admin: its tenant's)", "tags": ["tokens"],
                    "security": [{"bearer": []}],
                    "responses": {"200": {"description": "TokenInfo[]", "content": {"application/json": {}}},
                                  "401": {"$ref": "#/components/responses/Error"},
                                  "403": {"$ref": "#/components/responses/Error"}}
                },
                "post": op("Create a token for a user (admin: any role; a tenant admin: its tenant's tenant and tenant-admin tokens); the secret is shown once", "tokens", Some("TokenRequest"), ("201", "TokenCreated"))
            },
            "/v1/tokens/{id}/revoke": {"post": op("Revoke a token; it stops working at once (the last admin token cannot be revoked)", "tokens", None, ("200", "TokenInfo")),
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]},
            "/v1/nodes": {
                "post": op("Register a node (join token, admin token, or the node's own credential); returns the node's new credential. The node's price per GPU-hour is price_per_gpu_hour when given (0 to 1000000, else 422), else the server's price catalogue's for its GPU model and lifecycle label (on-demand, spot, reserved); spec.price_per_gpu_hour is ignored", "nodes", Some("{spec: NodeSpec, fake: bool, price_per_gpu_hour?: number}"), ("201", "NodeRegistered")),
                "get": op("Nodes", "nodes", None, ("200", "NodeView[]"))
            },
            "/v1/nodes/{name}/{action}": {"post": op("cordon, drain or uncordon a node (admin)", "nodes", None, ("200", "NodeView")),
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
                               {"name": "action", "in": "path", "required": true, "schema": {"type": "string", "enum": ["cordon", "drain", "uncordon"]}}]},
            "/v1/agents/{node}/sync": {"post": op("Agent report and the node's task set (the node's own credential; long poll)", "agents", Some("AgentSync"), ("200", "AgentWork")),
                "parameters": [{"name": "node", "in": "path", "required": true, "schema": {"type": "string"}}]},
            "/v1/cluster": {"get": op("Cluster summary", "cluster", None, ("200", "ClusterSummary"))},
            "/v1/cluster/history": {"get": op("GPU allocation and queue length, sampled every 15 s over the last 12 hours", "cluster", None, ("200", "HistoryPoint[]"))},
            "/v1/queue": {"get": op("Queued jobs in policy order with why-pending reasons and ETAs (a tenant sees its own)", "jobs", None, ("200", "QueueView")),
                "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}}]},
            "/v1/whoami": {"get": op("The role (admin or tenant) of the token", "cluster", None, ("200", "WhoAmI"))},
            "/v1/health": {"get": {"summary": "Whether the control plane accepts changes (503: its store refused a write and it is read-only until restarted), and its role: leader, or (replicas on PostgreSQL) standby with the leader's address; no token", "tags": ["cluster"], "security": [],
                "responses": {"200": {"description": "ok, or a standby"}, "503": {"description": "degraded: read-only, or no leader serves yet"}}}},
            "/v1/usage": {"get": op("Usage and cost per tenant, job and GPU model over a period: GPU-, CPU core- and memory GiB-hours; gpu_cost, cpu_cost, mem_cost and cost (their sum) in the catalogue's currency; billed per started second", "billing", None, ("200", "UsageReport"))},
            "/v1/events": {"get": op("Server-sent events of jobs (a tenant sees its own)", "events", None, ("200", "text/event-stream"))},
            "/metrics": {"get": op("Prometheus metrics (admin)", "metrics", None, ("200", "text/plain"))}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {"Error": {"description": "An error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}},
            "schemas": {
                "ErrorBody": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}}}}}
            }
        }
    })
}

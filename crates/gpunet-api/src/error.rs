//! API errors: a machine-readable code, a message that names the field and what is allowed, and the field.
//! Served as `{"error": {"code", "message", "field"}}` with the status of [`ApiError::status`].

use serde::{Deserialize, Serialize};

/// One API error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Machine-readable code: `invalid_field`, `unknown_field`, `missing_field`, `never_fits`, `parse_error`, `not_found`,
    /// `unauthorized`, `forbidden`, `conflict`, `too_large`, `limit_exceeded`, `unavailable`, `interrupted` (503: the
    /// server stopped before answering, or its store refused the write, and the outcome is not known), `internal`.
    pub code: String,
    /// What went wrong, naming the field and what is allowed.
    pub message: String,
    /// The field, as a path (`spec.template.spec.containers[0].resources.limits.nvidia.com/gpu`), when one is at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// The response body of an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ApiError,
}

impl ApiError {
    /// A field with a value that is not allowed. The value (and the field path) shown are cut to a few hundred
    /// bytes, so that an error about a huge value is not itself huge.
    pub fn invalid(field: &str, value: &str, allowed: &str) -> ApiError {
        let value = crate::limits::truncate(value, 200);
        let field = crate::limits::truncate(field, 300);
        ApiError {
            code: "invalid_field".into(),
            message: format!("invalid {field} {value:?}: allowed is {allowed}"),
            field: Some(field),
        }
    }

    /// A server limit was reached (a per-tenant count or size, concurrent streams): 429, naming the limit.
    pub fn limit(message: impl Into<String>) -> ApiError {
        ApiError { code: "limit_exceeded".into(), message: message.into(), field: None }
    }

    /// A field gpunet does not know.
    pub fn unknown(field: &str, allowed: &str) -> ApiError {
        let field = crate::limits::truncate(field, 300);
        ApiError {
            code: "unknown_field".into(),
            message: format!("unknown field {field}; allowed are {allowed}"),
            field: Some(field),
        }
    }

    /// No node of the cluster could ever hold the job (422), with why; `hold_never_fits` keeps such a job.
    pub fn never_fits(why: &str) -> ApiError {
        ApiError {
            code: "never_fits".into(),
            message: format!(
                "the job can never run on this cluster: {why} (hold_never_fits: true, or `--hold-never-fits`, keeps it \
                 waiting for such a node)"
            ),
            field: None,
        }
    }

    /// A required field is missing.
    pub fn missing(field: &str) -> ApiError {
        ApiError { code: "missing_field".into(), message: format!("missing field {field}"), field: Some(field.into()) }
    }

    /// The document does not parse.
    pub fn parse(message: impl Into<String>) -> ApiError {
        let message = crate::limits::truncate(&message.into(), 1000);
        ApiError { code: "parse_error".into(), message, field: None }
    }

    /// Any other error of a code.
    pub fn new(code: &str, message: impl Into<String>) -> ApiError {
        ApiError { code: code.into(), message: message.into(), field: None }
    }

    /// The HTTP status for the code: 400 parse, 422 validation, 401, 403, 404, 409, 413, 429, 503 unavailable, 500.
    pub fn status(&self) -> u16 {
        match self.code.as_str() {
            "parse_error" => 400,
            "invalid_field" | "unknown_field" | "missing_field" | "never_fits" => 422,
            "unauthorized" => 401,
            "forbidden" => 403,
            "not_found" => 404,
            "conflict" => 409,
            "too_large" => 413,
            "unavailable" | "interrupted" => 503,
            "limit_exceeded" => 429,
            _ => 500,
        }
    }

    /// The response body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: self.clone() }
    }
}

impl From<gpunet_core::CoreError> for ApiError {
    fn from(e: gpunet_core::CoreError) -> ApiError {
        use gpunet_core::CoreError as C;
        match &e {
            // As `invalid` writes it: the value cut short (a refused 900 KB name was echoed whole).
            C::InvalidField { field, value, allowed } => ApiError::invalid(field, value, allowed),
            C::UnknownJob(_) | C::UnknownNode(_) | C::UnknownTenant(_) => ApiError::new("not_found", e.to_string()),
            C::UnknownDependency(_) => {
                ApiError { code: "not_found".into(), message: e.to_string(), field: Some("dependency".into()) }
            }
            C::DuplicateJob(_) | C::DuplicateName { .. } | C::InvalidTransition { .. } | C::NotHoldable { .. } => {
                ApiError::new("conflict", e.to_string())
            }
            C::InvalidPlacement { .. } => ApiError::new("internal", e.to_string()),
            C::InvalidFile { .. } => ApiError::parse(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_shape_and_status() {
        let e = ApiError::invalid("tasks", "0", "1 to 4096");
        let v = serde_json::to_value(e.body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_field");
        assert_eq!(v["error"]["field"], "tasks");
        assert_eq!(v["error"]["message"], "invalid tasks \"0\": allowed is 1 to 4096");
        assert_eq!(e.status(), 422);
        assert_eq!(ApiError::parse("x").status(), 400);
        let core: ApiError = gpunet_core::CoreError::UnknownJob(gpunet_core::JobId(3)).into();
        assert_eq!((core.code.as_str(), core.status()), ("not_found", 404));
        // A core refusal of a huge value echoes a few hundred bytes of it, as `invalid` does.
        let huge = "n".repeat(900_000);
        let e =
            gpunet_core::CoreError::InvalidField { field: "name", value: huge, allowed: "1 to 253 characters".into() };
        let e: ApiError = e.into();
        assert!(
            e.message.len() < 400 && e.message.ends_with("…\": allowed is 1 to 253 characters"),
            "{}",
            e.message.len()
        );
        assert_eq!((e.code.as_str(), e.field.as_deref()), ("invalid_field", Some("name")));
    }
}

//! Typed identifiers. Every id is a thin newtype made by one macro so that a `JobId` can never be passed where a
//! `NodeId` is expected. Node and tenant ids are dense indexes into the cluster state; job ids are assigned by the
//! driver (server or simulator) and only need to be unique.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $inner:ty, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw number inside the id.
            pub const fn get(self) -> $inner {
                self.0
            }
            /// The id as an index into a dense table.
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }
    };
}

id_type!(
    /// A job, unique for the lifetime of a cluster.
    JobId, u64, "job-"
);
id_type!(
    /// A node: an index into the cluster's node table, stable for the lifetime of a `ClusterState`.
    NodeId, u32, "node-"
);
id_type!(
    /// A tenant (team, virtual cluster): an index into the cluster's tenant table.
    TenantId, u32, "tenant-"
);

//! An object's `apiVersion` split into group and version, in one place: discovery, the kind keys
//! of the caches and the simulator's store all read it the same way. A bottom module: it imports
//! nothing of the crate.

/// An `apiVersion` in its parts: `group/version`, or a bare `version` of the core group (`v1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ApiVersion<'a> {
    /// The API group (`""` for the core group).
    pub group: &'a str,
    /// The version within the group.
    pub version: &'a str,
}

impl<'a> ApiVersion<'a> {
    /// Splits `api_version` at its last `/`; without one it is a version of the core group.
    pub fn parse(api_version: &'a str) -> Self {
        match api_version.rsplit_once('/') {
            Some((group, version)) => ApiVersion { group, version },
            None => ApiVersion { group: "", version: api_version },
        }
    }
}

/// The API group of an `apiVersion` (`""` for the core group): the part of it caches key kinds by.
pub fn group_of(api_version: &str) -> &str {
    ApiVersion::parse(api_version).group
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_and_core_versions() {
        assert_eq!(
            ApiVersion::parse("cluster.x-k8s.io/v1beta2"),
            ApiVersion { group: "cluster.x-k8s.io", version: "v1beta2" }
        );
        assert_eq!(ApiVersion::parse("v1"), ApiVersion { group: "", version: "v1" });
        assert_eq!(ApiVersion::parse(""), ApiVersion { group: "", version: "" });
    }
}

//! Which health checks an object change concerns (being written).

//! # edgeflow

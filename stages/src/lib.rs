//! # edgeflow-stages

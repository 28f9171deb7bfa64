//! # edgeflow-audio

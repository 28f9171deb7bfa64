//! NPU delegate interface and the in-tree NPU simulator.

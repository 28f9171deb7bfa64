//! Runs the dataflow benchmark without the CLI (`edgeflow bench dataflow`
//! does the same): `cargo run -p edgeflow-graph --example bench_dataflow`.

fn main() -> Result<(), edgeflow_graph::Error> {
    let o = edgeflow_graph::bench::DataflowBenchOptions::default();
    let r = edgeflow_graph::bench::run_dataflow_bench(&o)?;
    print!("{}", r.render());
    Ok(())
}

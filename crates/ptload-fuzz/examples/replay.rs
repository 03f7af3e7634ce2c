//! Run one fuzz target on files, as libFuzzer would, without libFuzzer:
//! `cargo run -p ptload-fuzz --example replay -- TARGET FILE...`.
//! A panic prints the broken invariant.

fn main() {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_default();
    let run: fn(&[u8]) = match target.as_str() {
        "pickle_vm" => ptload_fuzz::pickle_vm,
        "container" => ptload_fuzz::container,
        "checkpoint" => ptload_fuzz::checkpoint,
        "map_location" => ptload_fuzz::map_location,
        "differential" => ptload_fuzz::differential,
        "structured" => ptload_fuzz::structured_bytes,
        _ => {
            eprintln!("usage: replay TARGET FILE... (pickle_vm, container, checkpoint, map_location, differential, structured)");
            std::process::exit(2);
        }
    };
    for path in args {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        println!("{path}");
        if target == "structured" {
            let mut u = arbitrary::Unstructured::new(&data);
            println!(
                "{:#?}",
                <ptload_fuzz::Model as arbitrary::Arbitrary>::arbitrary(&mut u)
            );
        }
        run(&data);
    }
}

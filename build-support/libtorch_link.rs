// Shared by the build scripts of every package that links libtorch (via `include!`).
//
// torch-sys exports its library folder as DEP_TCH_LIBTORCH_LIB to the build scripts of crates that
// depend on it directly; link args only reach a package's own binaries and tests, so each such
// package runs this. The rpath lets binaries and `cargo test` find libtorch without LD_LIBRARY_PATH.
fn emit_libtorch_link_args() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=COMAS_CUDA");
    match std::env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(lib) => println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}"),
        Err(_) => println!("cargo:warning=DEP_TCH_LIBTORCH_LIB is unset; binaries will need LD_LIBRARY_PATH"),
    }
    // `comas_model::process_setup!` defines MKL's vendor check in the binary; exported, it takes
    // the place of the one inside libtorch (where no binary defines it, this changes nothing).
    println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol=mkl_serv_intel_cpu_true");
    // `--as-needed` drops libtorch_cuda because nothing references it by symbol, and then CUDA is
    // never registered. GPU builds keep it with the `cuda` feature or COMAS_CUDA=1.
    let cuda_env = std::env::var("COMAS_CUDA").map(|v| v == "1" || v == "true").unwrap_or(false);
    if cuda_env || std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        // libtorch_cuda names cuBLAS, cuDNN, NCCL and the rest, which a build machine with only
        // the CUDA runtime wheels lacks: the binary resolves them where it runs (the GPU
        // machine's torch finds its own through its RPATH).
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
    }
}

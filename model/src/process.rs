//! Process-wide settings for every binary that runs libtorch on the CPU, installed with
//! `comas_model::process_setup!();` at the binary's top level:
//!
//! - **jemalloc as the allocator** of the whole process, Rust's and libtorch's C++ alike.
//!   libtorch allocates CPU tensors with `posix_memalign`; under glibc, blocks over 32 MB (logits,
//!   a training micro-batch's activations) are fresh `mmap`s whose pages the kernel zeroes again
//!   on every first touch. A SmolLM2 learner step spent 12.6 % of its time in the kernel (3.7 M
//!   page faults); under jemalloc with the settings below, 3 % (1.4 M faults), and it peaked
//!   lower (6.1 GB instead of 8.0). Run-time overrides go through jemalloc's `MALLOC_CONF`.
//! - **MKL's fast kernels on every x86 CPU.** The MKL inside libtorch picks slower code paths
//!   when `mkl_serv_intel_cpu_true` says the CPU is not Intel's, whatever its instruction set;
//!   on an AVX-512 AMD EPYC that halved the speed of f32 matrix products and of the CPU flash
//!   attention (which runs its products in f32). The binary defines that function, the build
//!   exports it (`build-support/libtorch_link.rs`), and the dynamic linker binds libtorch's
//!   calls to it; MKL then dispatches on the instruction set alone.
//!   `COMAS_MKL_VENDOR_CHECK=1` restores MKL's own answer.

pub use tikv_jemallocator::Jemalloc;

/// jemalloc's options, as a C string: no separate arena with eager purging for large blocks
/// (`oversize_threshold:0`), and freed pages kept for reuse rather than handed back to the kernel
/// (a decay of -1), so a service holds its peak memory.
pub const MALLOC_CONF: &[u8] = b"oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1\0";

/// The answer `mkl_serv_intel_cpu_true` gives: 1 (take the kernels the instruction set allows)
/// unless `COMAS_MKL_VENDOR_CHECK=1` asks for MKL's vendor check, which then answers 0 on
/// other vendors' CPUs (as MKL's own function does) and 1 on Intel's.
pub fn mkl_intel_cpu_answer() -> i32 {
    static ANSWER: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        if std::env::var("COMAS_MKL_VENDOR_CHECK").is_ok_and(|v| v == "1") {
            i32::from(cpu_vendor_is_intel())
        } else {
            1
        }
    })
}

fn cpu_vendor_is_intel() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.lines().any(|l| l.starts_with("vendor_id") && l.contains("GenuineIntel")))
}

/// Installs jemalloc with [`MALLOC_CONF`] and MKL's instruction-set dispatch (see the module
/// documentation).
#[macro_export]
macro_rules! process_setup {
    () => {
        #[global_allocator]
        static COMAS_GLOBAL_ALLOCATOR: $crate::process::Jemalloc = $crate::process::Jemalloc;

        /// Read by jemalloc at start-up (its `malloc_conf` symbol).
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static malloc_conf: Option<&'static u8> = Some(&$crate::process::MALLOC_CONF[0]);

        /// Called by the MKL inside libtorch in place of its own vendor check.
        #[no_mangle]
        pub extern "C" fn mkl_serv_intel_cpu_true() -> i32 {
            $crate::process::mkl_intel_cpu_answer()
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_jemalloc_options_are_one_c_string() {
        let conf = super::MALLOC_CONF;
        assert_eq!(conf.last(), Some(&0));
        assert_eq!(conf.iter().filter(|&&b| b == 0).count(), 1);
    }
}

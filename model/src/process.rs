//! Process-wide settings for every binary that runs libtorch on the CPU, installed with
//! `comas_model::process_setup!();` at the binary's top level:
//!
//! - **jemalloc as the allocator** of the whole process, Rust's and libtorch's C++ alike.
//!   libtorch allocates CPU tensors with `posix_memalign`; under glibc, blocks over 32 MB (logits,
//!   a training micro-batch's activations) are fresh `mmap`s whose pages the kernel zeroes again
//!   on every first touch. A SmolLM2 learner step spent 12.6 % of its time in the kernel (3.7 M
//!   page faults); under jemalloc, 3 % (1.4 M faults), and it peaked lower (6.1 GB instead of
//!   8.0). Freed pages are kept for reuse (a decay of -1), so a service holds its peak. jemalloc
//!   by default will not carve a request out of a free extent more than 64 times its size
//!   (`lg_extent_max_active_fit:6`); a learner's freed activations merge into extents that
//!   large, so each step mapped new memory beside them: a SmolLM2 LoRA learner whose batches
//!   vary in length as a rollout's do held 4,622 MiB after its first step and 7,054 after its
//!   sixth, with 717 MiB live (a 50-step study's learners: peaks 3.9 -> 8.4 GiB). Allowing any
//!   ratio (`lg_extent_max_active_fit:20`) holds it at 4,085-4,191 MiB, with fewer page faults
//!   (1.06 M against 1.80 M in 6 steps; steps of 11.1-12.4 s against 11.7-14.4; `cargo bench
//!   -p comas-learner --bench memory_soak`, experiments/learner-memory). Returning pages after
//!   jemalloc's default 10 s also held it (800-920 MiB between steps) but made steps 1.5x
//!   slower (29.8 M page faults). Run-time overrides go through jemalloc's `MALLOC_CONF`.
//! - **MKL's fast kernels on every x86 CPU.** The MKL inside libtorch picks slower code paths
//!   when `mkl_serv_intel_cpu_true` says the CPU is not Intel's, whatever its instruction set;
//!   on an AVX-512 AMD EPYC that halved the speed of f32 matrix products and of the CPU flash
//!   attention (which runs its products in f32). The binary defines that function, the build
//!   exports it (`build-support/libtorch_link.rs`), and the dynamic linker binds libtorch's
//!   calls to it; MKL then dispatches on the instruction set alone.
//!   `COMAS_MKL_VENDOR_CHECK=1` restores MKL's own answer.

pub use tikv_jemallocator::Jemalloc;

/// jemalloc's options, as a C string: no separate arena with eager purging for large blocks
/// (`oversize_threshold:0`), freed pages kept for reuse rather than handed back to the kernel
/// (a decay of -1), and a request served from any free extent large enough, however much larger
/// (`lg_extent_max_active_fit:20`), so that kept pages are reused rather than added to.
pub const MALLOC_CONF: &[u8] =
    b"oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1,lg_extent_max_active_fit:20\0";

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

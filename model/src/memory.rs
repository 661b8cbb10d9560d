//! How much memory a device has, for the submit-time check of a job's memory estimate.
use tch::Device;

/// Total memory of `device` in bytes, when it can be found out: for the CPU, the machine's
/// memory or the container's limit if that is lower; for a CUDA device, what the CUDA runtime
/// reports (the runtime is already in the process when libtorch was linked with CUDA).
pub fn total_bytes(device: Device) -> Option<u64> {
    match device {
        Device::Cpu => cpu_total(),
        Device::Cuda(i) => cuda_total(i),
        _ => None,
    }
}

fn cpu_total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let machine = kib * 1024;
    // cgroup v2, then v1; "max" or an absurd v1 value means no limit.
    let limit = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok().and_then(|t| t.trim().parse::<u64>().ok()));
    Some(limit.map_or(machine, |l| l.min(machine)))
}

type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> i32;
type SetDevice = unsafe extern "C" fn(i32) -> i32;
type GetDevice = unsafe extern "C" fn(*mut i32) -> i32;

/// `cudaMemGetInfo` answers for the calling thread's current device: the thread's device is
/// switched to `index` for the question and then set back, so that the thread that owns a
/// model on another device (or libtorch's own guard) finds it as it was.
fn cuda_total(index: usize) -> Option<u64> {
    // SAFETY: dlsym with RTLD_DEFAULT only looks symbols up; the three are called with the
    // signatures the CUDA runtime API documents, and only when all were found.
    unsafe {
        let find = |name: &std::ffi::CStr| {
            let f = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
            (!f.is_null()).then_some(f)
        };
        let get = find(c"cudaMemGetInfo")?;
        let set = find(c"cudaSetDevice")?;
        let current = find(c"cudaGetDevice")?;
        let get = std::mem::transmute::<*mut libc::c_void, MemGetInfo>(get);
        let set = std::mem::transmute::<*mut libc::c_void, SetDevice>(set);
        let current = std::mem::transmute::<*mut libc::c_void, GetDevice>(current);
        let mut before = 0i32;
        if current(&mut before) != 0 {
            return None;
        }
        if before != index as i32 && set(index as i32) != 0 {
            return None;
        }
        let (mut free, mut total) = (0usize, 0usize);
        let ok = get(&mut free, &mut total) == 0;
        if before != index as i32 {
            set(before);
        }
        ok.then_some(total as u64)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cpu_has_some_memory() {
        let b = super::total_bytes(tch::Device::Cpu).expect("Linux reports its memory");
        assert!(b > 1 << 28, "{b}");
    }
}

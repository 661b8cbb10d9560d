//! Parsing of dtype and device names as they appear in configs and on the command line.
use crate::error::{ModelError, Result};
use tch::{Device, Kind};

/// Parses `float32`/`f32`/`bfloat16`/`bf16`/`float16`/`f16` (with or without a `torch.` prefix).
pub fn parse_kind(name: &str) -> Result<Kind> {
    match name.trim().trim_start_matches("torch.") {
        "float32" | "f32" | "float" | "fp32" => Ok(Kind::Float),
        "bfloat16" | "bf16" => Ok(Kind::BFloat16),
        "float16" | "f16" | "half" | "fp16" => Ok(Kind::Half),
        other => Err(ModelError::Config(format!(
            "unsupported dtype `{other}`; use one of float32, bfloat16, float16"
        ))),
    }
}

/// Whether this machine's CPU multiplies bf16 matrices in hardware (AMX or AVX-512 BF16), where
/// bf16 runs matrix products several times faster than f32; elsewhere bf16 on the CPU is
/// emulated and slower. Reads the CPU flags Linux reports; false anywhere else.
pub fn cpu_has_fast_bf16() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .filter(|l| l.starts_with("flags"))
            .take(1)
            .any(|l| l.split_whitespace().any(|f| f == "amx_bf16" || f == "avx512_bf16"))
    })
}

pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Int => "int32",
        Kind::Bool => "bool",
        _ => "other",
    }
}

/// Parses `cpu`, `cuda`, `cuda:N`. A CUDA device on a machine without one is an error, not a
/// silent fall-back to the CPU.
pub fn parse_device(name: &str) -> Result<Device> {
    let name = name.trim();
    let device = match name {
        "cpu" => Device::Cpu,
        "cuda" => Device::Cuda(0),
        _ => match name.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(i) => Device::Cuda(i),
            None => {
                return Err(ModelError::Config(format!(
                    "unknown device `{name}`; use cpu, cuda or cuda:N"
                )))
            }
        },
    };
    if let Device::Cuda(i) = device {
        let count = tch::Cuda::device_count() as usize;
        if i >= count {
            return Err(ModelError::Config(format!(
                "device `{name}` requested but libtorch sees {count} CUDA device(s); \
                 GPU builds need the `cuda` feature or COMAS_CUDA=1 at build time"
            )));
        }
    }
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job check reads device names with the workflow's `device_name` (it cannot depend on
    /// this crate): both must read the same names.
    #[test]
    fn the_job_check_reads_device_names_as_the_loader_does() {
        use comas_workflow::train_config::{device_name, DeviceName};
        for name in ["cpu", "cuda", "cuda:0", "cuda:3", " cuda:1 ", "tpu", "cuda:", "cuda:x", "gpu"]
        {
            let ours = match parse_device(name) {
                Ok(Device::Cpu) => Some(DeviceName::Cpu),
                Ok(Device::Cuda(i)) => Some(DeviceName::Cuda(i)),
                // A CUDA name the machine has no device for is still a name.
                Err(e) if !e.to_string().contains("unknown device") => device_name(name),
                _ => None,
            };
            assert_eq!(ours, device_name(name), "{name}");
        }
    }

    #[test]
    fn kinds_parse() {
        assert_eq!(parse_kind("torch.bfloat16").unwrap(), Kind::BFloat16);
        assert_eq!(parse_kind("float32").unwrap(), Kind::Float);
        assert_eq!(parse_kind("f16").unwrap(), Kind::Half);
        assert!(parse_kind("int8").unwrap_err().to_string().contains("int8"));
    }

    #[test]
    fn devices_parse() {
        assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
        assert!(parse_device("tpu").is_err());
    }
}

//! ggml tensor types: their block layout, and dequantisation to f32 for the types comas imports.
//! Block layouts follow ggml's `ggml-common.h`; results match gguf-py's numpy dequantisation
//! (checked in `tests/quants.rs` against committed reference values).
use crate::error::{GgufError, Result};
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
}

/// The types [`GgmlType::dequantize`] handles, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

/// Values per super-block of the K-quants.
const QK_K: usize = 256;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            _ => return None,
        })
    }

    pub fn name(self) -> String {
        format!("{self:?}")
    }

    /// (values per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            IQ4_NL => (32, 18),
            Q2_K => (QK_K, 84),
            Q3_K => (QK_K, 110),
            Q4_K => (QK_K, 144),
            Q5_K => (QK_K, 176),
            Q6_K => (QK_K, 210),
            Q8_K => (QK_K, 292),
            IQ2_XXS => (QK_K, 66),
            IQ2_XS => (QK_K, 74),
            IQ3_XXS => (QK_K, 98),
            IQ1_S => (QK_K, 50),
            IQ3_S => (QK_K, 110),
            IQ2_S => (QK_K, 82),
            IQ4_XS => (QK_K, 136),
            IQ1_M => (QK_K, 56),
            TQ1_0 => (QK_K, 54),
            TQ2_0 => (QK_K, 66),
        }
    }

    /// Bytes a tensor of these ggml dimensions occupies; rows must hold whole blocks.
    pub fn bytes_for(self, dims: &[u64]) -> std::result::Result<u64, String> {
        let (per_block, block_bytes) = self.block();
        let row = dims.first().copied().unwrap_or(1);
        if row % per_block as u64 != 0 {
            return Err(format!(
                "its row length {row} is not a multiple of {self:?}'s block of {per_block} values"
            ));
        }
        dims.iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| (n / per_block as u64).checked_mul(block_bytes as u64))
            .ok_or_else(|| format!("dimensions {dims:?} overflow"))
    }

    /// Dequantises whole blocks of `data` to f32, in storage order.
    pub fn dequantize(self, data: &[u8]) -> Result<Vec<f32>> {
        use GgmlType::*;
        let (per_block, block_bytes) = self.block();
        if data.len() % block_bytes != 0 {
            return Err(GgufError::Unsupported(format!(
                "{self:?} data of {} bytes is not whole blocks",
                data.len()
            )));
        }
        let mut out = Vec::with_capacity(data.len() / block_bytes * per_block);
        let blocks = data.chunks_exact(block_bytes);
        match self {
            F32 => out.extend(blocks.map(|b| f32::from_le_bytes(b.try_into().unwrap()))),
            F16 => out.extend(blocks.map(|b| half_at(b, 0))),
            BF16 => out.extend(
                blocks.map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
            ),
            Q8_0 => blocks.for_each(|b| q8_0(b, &mut out)),
            Q4_0 => blocks.for_each(|b| q4_0(b, &mut out)),
            Q4_1 => blocks.for_each(|b| q4_1(b, &mut out)),
            Q5_0 => blocks.for_each(|b| q5_0(b, &mut out)),
            Q5_1 => blocks.for_each(|b| q5_1(b, &mut out)),
            Q4_K => blocks.for_each(|b| q4_k(b, &mut out)),
            Q5_K => blocks.for_each(|b| q5_k(b, &mut out)),
            Q6_K => blocks.for_each(|b| q6_k(b, &mut out)),
            other => {
                return Err(GgufError::Unsupported(format!(
                    "dequantising {other:?} is not supported; supported: {SUPPORTED}"
                )))
            }
        }
        Ok(out)
    }

    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K)
    }
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// d: f16, qs: 32 × i8.
fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| f32::from(q as i8) * d));
}

/// d: f16, qs: 16 bytes; low nibbles are values 0..16, high nibbles 16..32, offset by 8.
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| f32::from((q & 0x0f) as i8 - 8) * d));
    out.extend(qs.iter().map(|&q| f32::from((q >> 4) as i8 - 8) * d));
}

/// d, m: f16, qs: 16 bytes; x = q·d + m.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| f32::from(q & 0x0f) * d + m));
    out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
}

/// The fifth bits of a Q5 block: bit j of `qh` belongs to value j.
fn q5_values(qh: u32, qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let lo = qs.iter().enumerate().map(move |(j, &q)| (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4));
    let hi =
        qs.iter().enumerate().map(move |(j, &q)| (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4));
    lo.chain(hi)
}

/// d: f16, qh: u32, qs: 16 bytes; offset by 16.
fn q5_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes(b[2..6].try_into().unwrap());
    out.extend(q5_values(qh, &b[6..22]).map(|q| f32::from(q as i8 - 16) * d));
}

/// d, m: f16, qh: u32, qs: 16 bytes; x = q·d + m.
fn q5_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes(b[4..8].try_into().unwrap());
    out.extend(q5_values(qh, &b[8..24]).map(|q| f32::from(q) * d + m));
}

/// The 6-bit scale and min of sub-block `j` (of 8) packed in the 12 `scales` bytes of Q4_K/Q5_K.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// d, dmin: f16, scales: 12 bytes, qs: 128 bytes; 8 sub-blocks of 32 with their own scale and min.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    for (chunk, q) in b[16..144].chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        out.extend(q.iter().map(|&v| d1 * f32::from(v & 0x0f) - min1));
        out.extend(q.iter().map(|&v| d2 * f32::from(v >> 4) - min2));
    }
}

/// Q4_K plus a fifth bit per value in `qh` (32 bytes): bits 2c and 2c+1 serve chunk c.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (chunk, ql) in b[48..176].chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        out.extend(
            ql.iter().zip(qh).map(|(&l, &h)| {
                d1 * f32::from((l & 0x0f) + if h & u1 != 0 { 16 } else { 0 }) - min1
            }),
        );
        out.extend(
            ql.iter()
                .zip(qh)
                .map(|(&l, &h)| d2 * f32::from((l >> 4) + if h & u2 != 0 { 16 } else { 0 }) - min2),
        );
    }
}

/// ql: 128 bytes (low 4 bits), qh: 64 bytes (high 2 bits), scales: 16 × i8, d: f16; offset by 32.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    let start = out.len();
    out.resize(start + QK_K, 0.0);
    let y = &mut out[start..];
    for half in 0..2 {
        let (ql, qh, sc, y) =
            (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..], &mut y[128 * half..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |k: usize| d * f32::from(sc[is + k] as i8);
            y[l] = s(0) * f32::from(q1);
            y[l + 32] = s(2) * f32::from(q2);
            y[l + 64] = s(4) * f32::from(q3);
            y[l + 96] = s(6) * f32::from(q4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_block_scales_signed_bytes() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = (-4i8) as u8;
        b[3] = 6;
        let v = GgmlType::Q8_0.dequantize(&b).unwrap();
        assert_eq!((v.len(), v[0], v[1], v[2]), (32, -2.0, 3.0, 0.0));
    }

    #[test]
    fn q4_0_nibbles_are_ordered_low_then_high() {
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes());
        b[2] = 0xF1; // value 0: 1 - 8, value 16: 15 - 8
        let v = GgmlType::Q4_0.dequantize(&b).unwrap();
        assert_eq!((v[0], v[16], v[1]), (-7.0, 7.0, -8.0));
    }

    #[test]
    fn scale_min_unpacks_high_sub_blocks() {
        let mut s = [0u8; 12];
        s[0] = 0b1100_0000; // high bits of sub-block 4's scale
        s[4] = 0b0100_0000; // high bits of sub-block 4's min
        s[8] = 0x21; // low nibbles: scale 1, min 2
        assert_eq!(scale_min_k4(4, &s), (1 | (3 << 4), 2 | (1 << 4)));
    }

    #[test]
    fn rows_must_hold_whole_blocks() {
        assert!(GgmlType::Q4_K.bytes_for(&[128, 2]).unwrap_err().contains("multiple of"));
        assert_eq!(GgmlType::Q4_K.bytes_for(&[512, 3]).unwrap(), 6 * 144);
        assert!(GgmlType::IQ2_XS.dequantize(&[0u8; 74]).is_err());
    }
}

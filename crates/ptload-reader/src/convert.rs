//! Explicit dtype conversion of tensor bytes: F64, F32, F16, BF16 and the
//! float8 kinds E4M3 (fn) and E5M2, with torch's rounding.
//!
//! Conversions go through f32 (torch converts float64 to the 16- and 8-bit
//! types through float as well); to F64 they are exact.

use crate::error::{Error, ErrorKind, Result};
use crate::torch::dtype::DType;

fn supported(d: DType) -> bool {
    matches!(
        d,
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
    )
}

/// Whether [`convert`] converts `from` to `to`.
pub fn can_convert(from: DType, to: DType) -> bool {
    supported(from) && supported(to)
}

/// float8_e4m3fn to f32 (exact).
fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let mant = f32::from(b & 0x07);
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * mant * 2f32.powi(-9)
    } else {
        sign * (1.0 + mant / 8.0) * 2f32.powi(exp - 7)
    }
}

/// float8_e5m2 to f32 (exact: it is the top byte of a float16).
fn e5m2_to_f32(b: u8) -> f32 {
    half::f16::from_bits(u16::from(b) << 8).to_f32()
}

/// f32 to float8_e4m3fn, rounding to nearest even; values at or beyond
/// 480 in magnitude (and NaN) become NaN, as in torch (no infinity in this type).
fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    // 480.0: the first magnitude that rounds past the largest finite, 448.
    if abs >= 0x43f0_0000 {
        return sign | 0x7f;
    }
    // Below 2^-6 the result is subnormal (steps of 2^-9): adding 2^14, whose
    // ulp is 2^-9, makes the hardware round at that step; the low bits of
    // the sum are then the subnormal's mantissa.
    if abs < 0x3c80_0000 {
        let shifted = f32::from_bits(abs) + 16384.0;
        let r = (shifted.to_bits().wrapping_sub(16384f32.to_bits())) as u8;
        return sign | r;
    }
    let odd = (abs >> 20) & 1;
    let rounded = abs.wrapping_add(0xc407_ffff).wrapping_add(odd);
    sign | (rounded >> 20) as u8
}

/// f32 to float8_e5m2, rounding to nearest even; overflow to infinity,
/// NaN stays NaN, as in torch.
fn f32_to_e5m2(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs >= 0x4780_0000 {
        // 65536.0 and beyond: infinity; NaN stays NaN.
        return sign | if abs > 0x7f80_0000 { 0x7f } else { 0x7c };
    }
    if abs < 0x3880_0000 {
        // Subnormal (below 2^-14, steps of 2^-16): 2^7 has ulp 2^-16.
        let shifted = f32::from_bits(abs) + 128.0;
        let r = (shifted.to_bits().wrapping_sub(128f32.to_bits())) as u8;
        return sign | r;
    }
    let odd = (abs >> 21) & 1;
    let rounded = abs.wrapping_add(0xc80f_ffff).wrapping_add(odd);
    sign | (rounded >> 21) as u8
}

fn read(d: DType, e: &[u8]) -> f64 {
    let mut b = [0u8; 8];
    b.iter_mut().zip(e).for_each(|(o, i)| *o = *i);
    match d {
        DType::F64 => f64::from_le_bytes(b),
        DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F8E4M3 => f64::from(e4m3_to_f32(b[0])),
        _ => f64::from(e5m2_to_f32(b[0])),
    }
}

fn write(d: DType, v: f64, out: &mut Vec<u8>) {
    // Narrow types go through f32, as torch does from float64.
    let f = v as f32;
    match d {
        DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
        DType::F32 => out.extend_from_slice(&f.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&half::f16::from_f32(f).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16_from_f32(f).to_le_bytes()),
        DType::F8E4M3 => out.push(f32_to_e4m3(f)),
        _ => out.push(f32_to_e5m2(f)),
    }
}

/// bfloat16 with torch's rounding: nearest even, NaN as 0x7fc0.
fn bf16_from_f32(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7fc0;
    }
    let bits = f.to_bits();
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// Convert little-endian elements of `from` to little-endian elements of `to`.
pub fn convert(bytes: &[u8], from: DType, to: DType) -> Result<Vec<u8>> {
    if !can_convert(from, to) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("conversion from {from} to {to} is not supported (floating types F64 F32 F16 BF16 F8_E4M3 F8_E5M2 only)"),
        ));
    }
    let n = bytes.len() / from.size();
    let mut out = Vec::with_capacity(n.saturating_mul(to.size()));
    if from == to {
        out.extend_from_slice(bytes);
        return Ok(out);
    }
    for e in bytes.chunks_exact(from.size()) {
        write(to, read(from, e), &mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float8_known_values() {
        for (x, b) in [
            (0.0f32, 0x00u8),
            (1.0, 0x38),
            (-2.0, 0xc0),
            (448.0, 0x7e),
            (464.0, 0x7e),
            (470.0, 0x7f),
            (480.0, 0x7f),
            (0.001953125, 0x01),
        ] {
            assert_eq!(f32_to_e4m3(x), b, "e4m3 {x}");
        }
        for b in 0..=255u8 {
            let x = e4m3_to_f32(b);
            if !x.is_nan() {
                assert_eq!(f32_to_e4m3(x), b, "e4m3 round trip {b:#x}");
            }
            let y = e5m2_to_f32(b);
            if !y.is_nan() {
                assert_eq!(f32_to_e5m2(y), b, "e5m2 round trip {b:#x}");
            }
        }
        assert_eq!(f32_to_e5m2(1.0), 0x3c);
        assert_eq!(f32_to_e5m2(1e6), 0x7c);
        assert_eq!(f32_to_e5m2(f32::NAN) & 0x7f, 0x7f);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_from_f32(1.0), 0x3f80);
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f81_8000)), 0x3f82);
    }
}

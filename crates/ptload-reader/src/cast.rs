//! Explicit dtype conversion of tensor bytes: F64, F32, F16, BF16 and the
//! float8 kinds E4M3 (fn) and E5M2, with torch's rounding.
//!
//! Conversions go through f32 (torch converts float64 to the 16- and 8-bit
//! types through float as well); to F64 they are exact.

#[cfg(feature = "parallel")]
use rayon::prelude::*;

use crate::error::{Error, ErrorKind, Result};
use crate::torch::dtype::{f16_to_f32, f32_to_f16, DType, Element};

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

/// What a tensor of `from` becomes when everything floating is asked to
/// become `to` (`--dtype`): `Some(to)` when it converts, `None` when it stays
/// as it is (integers, bools, complex, the same dtype, `to` unset).
pub fn target(from: DType, to: Option<DType>) -> Option<DType> {
    to.filter(|&to| from.is_float() && from != to && can_convert(from, to))
}

/// float8_e4m3fn to f32 bits, exactly as torch computes them (its NaN,
/// 0x7f, becomes 0x7ff00000).
fn e4m3_to_f32_bits(b: u8) -> u32 {
    let w = u32::from(b) << 24;
    let sign = w & 0x8000_0000;
    let nonsign = w & 0x7fff_ffff;
    if nonsign == 0 {
        return sign;
    }
    let clz = nonsign.leading_zeros();
    let renorm = clz.saturating_sub(4);
    let inf_nan = if nonsign.wrapping_add(0x0100_0000) & 0x8000_0000 != 0 {
        0x7f80_0000
    } else {
        0
    };
    let value = ((nonsign << renorm) >> 4).wrapping_add((0x78 - renorm) << 23);
    sign | value | inf_nan
}

fn e4m3_to_f32(b: u8) -> f32 {
    f32::from_bits(e4m3_to_f32_bits(b))
}

/// float8_e5m2 to f32 (exact: it is the top byte of a float16).
fn e5m2_to_f32(b: u8) -> f32 {
    f16_to_f32(u16::from(b) << 8)
}

/// f32 to float8_e4m3fn, rounding to nearest even. The type has no
/// infinity: finite values beyond 448 and infinities saturate to +-448, as
/// torch does; NaN stays NaN (0x7f, with its sign).
fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7f;
    }
    // 464 (the tie between 448 and the NaN pattern) and beyond: saturate.
    if abs >= 0x43e8_0000 {
        return sign | 0x7e;
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

/// bfloat16 with torch's rounding: nearest even; NaN as 0x7fc0.
fn bf16_from_f32(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7fc0;
    }
    let bits = f.to_bits();
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// One element, decoded: float64 sources keep their precision; every other
/// source is exactly an f32.
#[derive(Clone, Copy)]
enum Elem {
    F64(f64),
    F32(f32),
}

fn read(d: DType, e: &[u8]) -> Elem {
    let mut b = [0u8; 8];
    b.iter_mut().zip(e).for_each(|(o, i)| *o = *i);
    let [b0, b1, b2, b3, ..] = b;
    match d {
        DType::F64 => Elem::F64(f64::from_le_bytes(b)),
        DType::F32 => Elem::F32(f32::from_le_bytes([b0, b1, b2, b3])),
        DType::F16 => Elem::F32(f16_to_f32(u16::from_le_bytes([b0, b1]))),
        // bfloat16 is the top half of an f32: a plain shift, NaNs untouched.
        DType::BF16 => Elem::F32(f32::from_bits(
            u32::from(u16::from_le_bytes([b0, b1])) << 16,
        )),
        DType::F8E4M3 => Elem::F32(e4m3_to_f32(b0)),
        _ => Elem::F32(e5m2_to_f32(b0)),
    }
}

/// One element of `to`, written into `out` (exactly `to.size()` bytes).
fn write(from: DType, to: DType, v: Elem, out: &mut [u8]) {
    // Narrow targets go through f32, as torch does from float64.
    let f = match v {
        Elem::F64(x) => x as f32,
        Elem::F32(x) => x,
    };
    let put = |out: &mut [u8], bytes: &[u8]| {
        out.iter_mut().zip(bytes).for_each(|(o, b)| *o = *b);
    };
    match to {
        DType::F64 => put(
            out,
            &match v {
                Elem::F64(x) => x,
                Elem::F32(x) => f64::from(x),
            }
            .to_le_bytes(),
        ),
        DType::F32 => put(out, &f.to_le_bytes()),
        DType::F16 => {
            // torch keeps an f32 NaN's payload in float16, and gives the
            // canonical NaN from every other type.
            let h = if f.is_nan() && from != DType::F32 {
                0x7e00 | if f.is_sign_negative() { 0x8000 } else { 0 }
            } else {
                f32_to_f16(f)
            };
            put(out, &h.to_le_bytes());
        }
        DType::BF16 => put(out, &bf16_from_f32(f).to_le_bytes()),
        DType::F8E4M3 => put(out, &[f32_to_e4m3(f)]),
        _ => put(out, &[f32_to_e5m2(f)]),
    }
}

/// Elements converted per parallel task: large enough that splitting costs
/// nothing measurable, small enough to keep every core busy on one tensor.
#[cfg_attr(not(feature = "parallel"), allow(dead_code))]
const PARALLEL_CHUNK: usize = 1 << 16;

/// The error for a pair [`can_convert`] refuses.
fn unsupported(from: DType, to: DType) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!(
            "conversion from {from} to {to} is not supported (floating types F64 F32 F16 BF16 F8_E4M3 F8_E5M2 only)"
        ),
    )
}

/// Convert little-endian elements of `from` to little-endian elements of
/// `to`, bit for bit as torch's `.to(dtype)` (its scalar CPU kernels).
pub fn convert(bytes: &[u8], from: DType, to: DType) -> Result<Vec<u8>> {
    if !can_convert(from, to) {
        return Err(unsupported(from, to));
    }
    let (from_size, to_size) = (from.size(), to.size());
    let n = bytes.len() / from_size;
    if from == to {
        return Ok(bytes.get(..n * from_size).unwrap_or(bytes).to_vec());
    }
    let mut out = vec![0u8; n.saturating_mul(to_size)];
    let convert_run = |(dst, src): (&mut [u8], &[u8])| {
        convert_elements(src, from, to, dst);
    };
    // Tensors of many elements are split over the cores (rayon's pool,
    // feature `parallel`); small ones stay on the calling thread.
    #[cfg(feature = "parallel")]
    if n > PARALLEL_CHUNK {
        out.par_chunks_mut(PARALLEL_CHUNK * to_size)
            .zip(bytes.par_chunks(PARALLEL_CHUNK * from_size))
            .for_each(convert_run);
        return Ok(out);
    }
    convert_run((&mut out, bytes));
    Ok(out)
}

/// Convert as [`convert`] does, into `out`, on the calling thread: as many
/// elements as both hold (`bytes.len() / from.size()` and `out.len() /
/// to.size()`, the fewer); their count. For a caller that converts a
/// tensor piece by piece into buffers of its own (a GPU's staging
/// buffers), never holding the whole converted tensor.
pub fn convert_into(bytes: &[u8], from: DType, to: DType, out: &mut [u8]) -> Result<usize> {
    if !can_convert(from, to) {
        return Err(unsupported(from, to));
    }
    Ok(convert_elements(bytes, from, to, out))
}

fn convert_elements(src: &[u8], from: DType, to: DType, dst: &mut [u8]) -> usize {
    let (from_size, to_size) = (from.size(), to.size());
    let n = (src.len() / from_size).min(dst.len() / to_size);
    if from == to {
        let len = n * from_size;
        if let (Some(d), Some(s)) = (dst.get_mut(..len), src.get(..len)) {
            d.copy_from_slice(s);
        }
        return n;
    }
    for (d, e) in dst
        .chunks_exact_mut(to_size)
        .zip(src.chunks_exact(from_size))
    {
        write(from, to, read(from, e), d);
    }
    n
}

/// Typed reads into the caller's float type: `view.read_as::<f32>()` with
/// this trait in scope.
pub trait ReadAs {
    /// The elements as an owned vector of `T`, converted from the tensor's
    /// element type as torch's `tensor.to(dtype)` converts them (round to
    /// nearest even; see [`convert`]): `read_as::<f32>()` of a BF16 or F16
    /// tensor, `read_as::<half::bf16>()` of an F32 one (with the `half`
    /// feature). The same type is a
    /// plain [`TensorView::to_vec`](crate::TensorView::to_vec). Between
    /// floating types only (F64, F32, F16, BF16, F8_E4M3, F8_E5M2); another
    /// pair is an [`Unsupported`](ErrorKind::Unsupported) error naming both.
    ///
    /// ```
    /// # fn main() -> Result<(), ptload_reader::Error> {
    /// use ptload_reader::cast::ReadAs;
    ///
    /// let ckpt = ptload_reader::Checkpoint::open("../../fixtures/files/dtypes.pt")?;
    /// let bf16 = ckpt.tensor("bf16").unwrap();
    /// let wide: Vec<f32> = bf16.read_as()?;
    /// assert_eq!(wide.len() as u64, bf16.info().numel);
    /// # Ok(())
    /// # }
    /// ```
    fn read_as<T: Element>(&self) -> Result<Vec<T>>;
}

impl ReadAs for crate::view::TensorView<'_> {
    fn read_as<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE == self.dtype() {
            return self.to_vec();
        }
        let data = self.data()?;
        let bytes =
            convert(&data, self.dtype(), T::DTYPE).map_err(|e| e.for_tensor(self.name()))?;
        let numel = usize::try_from(self.info().numel).unwrap_or(usize::MAX);
        if bytes.len() != numel.saturating_mul(std::mem::size_of::<T>()) {
            return Err(Error::new(
                ErrorKind::Tensor,
                "the converted elements disagree with the tensor's shape",
            )
            .for_tensor(self.name()));
        }
        let mut out = vec![T::zeroed(); numel];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Converted piece by piece into a buffer of the caller's (at
    /// arbitrary element boundaries), a tensor is what `convert` gives
    /// whole; the count is what both sides hold; a pair `convert` refuses
    /// is refused.
    #[test]
    fn pieces_converted_into_a_buffer_join_into_the_whole() {
        let src: Vec<u8> = (0..1000u32)
            .flat_map(|i| (i as f32 * 0.37 - 91.5).to_le_bytes())
            .collect();
        for to in [
            DType::BF16,
            DType::F16,
            DType::F8E5M2,
            DType::F64,
            DType::F32,
        ] {
            let whole = convert(&src, DType::F32, to).unwrap();
            let mut joined = vec![0u8; whole.len()];
            let mut at = 0;
            for piece in [1usize, 7, 250, 333, 409] {
                let (from, to_at) = (at * 4, at * to.size());
                let n = convert_into(
                    &src[from..from + piece * 4],
                    DType::F32,
                    to,
                    &mut joined[to_at..],
                )
                .unwrap();
                assert_eq!(n, piece, "{to}");
                at += piece;
            }
            assert_eq!(at, 1000);
            assert_eq!(joined, whole, "{to}");
        }
        let mut short = [0u8; 6];
        assert_eq!(
            convert_into(&src, DType::F32, DType::BF16, &mut short).unwrap(),
            3
        );
        assert_eq!(
            &short[..],
            &convert(&src[..12], DType::F32, DType::BF16).unwrap()[..]
        );
        let e = convert_into(&src, DType::F32, DType::I64, &mut short).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }

    /// The parallel split gives what converting each element alone gives,
    /// across chunk boundaries and a partial last chunk.
    #[test]
    fn long_tensors_convert_like_single_elements() {
        let n = 2 * PARALLEL_CHUNK + 12_345;
        let mut bits = 0x1234_5678u32;
        let src: Vec<u8> = (0..n)
            .flat_map(|_| {
                bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                bits.to_le_bytes()
            })
            .collect();
        for to in [DType::BF16, DType::F16, DType::F8E4M3, DType::F64] {
            let all = convert(&src, DType::F32, to).unwrap();
            assert_eq!(all.len(), n * to.size());
            for (i, e) in src.chunks_exact(4).enumerate().step_by(997) {
                let one = convert(e, DType::F32, to).unwrap();
                assert_eq!(
                    &all[i * to.size()..(i + 1) * to.size()],
                    &one[..],
                    "{to} at {i}"
                );
            }
            let last = &src[src.len() - 4..];
            assert_eq!(
                &all[all.len() - to.size()..],
                &convert(last, DType::F32, to).unwrap()[..]
            );
        }
    }

    #[test]
    fn float8_known_values() {
        for (x, b) in [
            (0.0f32, 0x00u8),
            (1.0, 0x38),
            (-2.0, 0xc0),
            (448.0, 0x7e),
            (464.0, 0x7e),
            (470.0, 0x7e),
            (480.0, 0x7e),
            (f32::INFINITY, 0x7e),
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

    /// The reader's float16 conversions against the `half` crate's (the
    /// conversion the reader used before it had its own): every float16
    /// to f32, and f32s around every float16 (each value, its neighbours
    /// and the midpoints to the next, where ties round) back, plus a
    /// stride through every f32 bit pattern.
    #[test]
    fn float16_conversions_match_the_half_crate() {
        let same = |x: f32| {
            assert_eq!(
                f32_to_f16(x),
                half::f16::from_f32(x).to_bits(),
                "f32 {:#010x} to float16",
                x.to_bits()
            );
        };
        for h in 0..=u16::MAX {
            let ours = f16_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            assert_eq!(ours.to_bits(), theirs.to_bits(), "float16 {h:#06x} to f32");
            let bits = ours.to_bits();
            for x in [bits.wrapping_sub(1), bits, bits.wrapping_add(1)] {
                same(f32::from_bits(x));
            }
            if h & 0x7c00 != 0x7c00 {
                let next = f16_to_f32(h.wrapping_add(1));
                if next.is_finite() {
                    let mid = (f64::from(ours) + f64::from(next)) / 2.0;
                    for x in [mid as f32, (mid as f32).next_down(), (mid as f32).next_up()] {
                        same(x);
                    }
                }
            }
        }
        for bits in (0..=u32::MAX).step_by(4_099) {
            same(f32::from_bits(bits));
        }
    }
}

//! Element types torch saves.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, ErrorKind, Result};

/// The element type of a tensor, named as in safetensors where it has a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// float64
    F64,
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16
    BF16,
    /// float8_e4m3fn
    F8E4M3,
    /// float8_e5m2
    F8E5M2,
    /// float8_e4m3fnuz
    F8E4M3Fnuz,
    /// float8_e5m2fnuz
    F8E5M2Fnuz,
    /// float8_e8m0fnu
    F8E8M0,
    /// float4_e2m1fn_x2 (two 4-bit values per byte)
    F4E2M1X2,
    /// complex32 (two float16)
    C32,
    /// complex64 (two float32)
    C64,
    /// complex128 (two float64)
    C128,
    /// int8 (also qint8's integer representation)
    I8,
    /// int16
    I16,
    /// int32 (also qint32's)
    I32,
    /// int64
    I64,
    /// uint8 (also quint8's, and the packed quint4x2 / quint2x4)
    U8,
    /// uint16
    U16,
    /// uint32
    U32,
    /// uint64
    U64,
    /// bool, one byte per element
    Bool,
}

impl DType {
    /// Every element type, in declaration order.
    pub const ALL: [DType; 22] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::F8E8M0,
        DType::F4E2M1X2,
        DType::C32,
        DType::C64,
        DType::C128,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F8E4M3
            | DType::F8E5M2
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz
            | DType::F8E8M0
            | DType::F4E2M1X2
            | DType::I8
            | DType::U8
            | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 | DType::C32 => 4,
            DType::F64 | DType::I64 | DType::U64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// Bytes per byte-swapped unit: complex types swap per component.
    pub fn swap_unit(self) -> usize {
        match self {
            DType::C32 | DType::C64 | DType::C128 => self.size() / 2,
            _ => self.size(),
        }
    }

    /// Whether elements are complex (two float components).
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C32 | DType::C64 | DType::C128)
    }

    /// Whether elements are floating point (real or complex).
    pub fn is_float(self) -> bool {
        !matches!(
            self,
            DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
                | DType::Bool
        )
    }

    /// The name used in ptload's output (`F32`, `BF16`, `F8_E4M3`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E4M3Fnuz => "F8_E4M3FNUZ",
            DType::F8E5M2Fnuz => "F8_E5M2FNUZ",
            DType::F8E8M0 => "F8_E8M0",
            DType::F4E2M1X2 => "F4_E2M1_X2",
            DType::C32 => "C32",
            DType::C64 => "C64",
            DType::C128 => "C128",
            DType::I8 => "I8",
            DType::I16 => "I16",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::U8 => "U8",
            DType::U16 => "U16",
            DType::U32 => "U32",
            DType::U64 => "U64",
            DType::Bool => "BOOL",
        }
    }

    /// The dtype a safetensors header names: safetensors' names are
    /// ptload's, for the dtypes safetensors has (not complex32, complex128
    /// or packed float4 pairs; its `F4` and `F6_*` count elements in
    /// nibbles and are not read).
    pub(crate) fn from_safetensors_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .filter(|d| !matches!(d, DType::C32 | DType::C128 | DType::F4E2M1X2))
            .find(|d| d.name() == name)
    }

    /// The dtype named `torch.<name>` (a dtype global), if torch saves it.
    pub(crate) fn from_torch_name(name: &str) -> Option<DType> {
        Some(match name {
            "float64" | "double" => DType::F64,
            "float32" | "float" => DType::F32,
            "float16" | "half" => DType::F16,
            "bfloat16" => DType::BF16,
            "float8_e4m3fn" => DType::F8E4M3,
            "float8_e5m2" => DType::F8E5M2,
            "float8_e4m3fnuz" => DType::F8E4M3Fnuz,
            "float8_e5m2fnuz" => DType::F8E5M2Fnuz,
            "float8_e8m0fnu" => DType::F8E8M0,
            "float4_e2m1fn_x2" => DType::F4E2M1X2,
            "complex32" | "chalf" => DType::C32,
            "complex64" | "cfloat" => DType::C64,
            "complex128" | "cdouble" => DType::C128,
            "int8" | "qint8" => DType::I8,
            "int16" | "short" => DType::I16,
            "int32" | "int" | "qint32" => DType::I32,
            "int64" | "long" => DType::I64,
            "uint8" | "quint8" | "quint4x2" | "quint2x4" | "bits8" => DType::U8,
            "uint16" | "bits16" => DType::U16,
            "uint32" => DType::U32,
            "uint64" => DType::U64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// Whether `torch.<name>` is a dtype torch defines, known or not here.
    pub(crate) fn is_torch_dtype_name(name: &str) -> bool {
        DType::from_torch_name(name).is_some()
            || matches!(
                name,
                "bits1x8"
                    | "bits2x4"
                    | "bits4x2"
                    | "bits16"
                    | "uint1"
                    | "uint2"
                    | "uint3"
                    | "uint4"
                    | "uint5"
                    | "uint6"
                    | "uint7"
                    | "int1"
                    | "int2"
                    | "int3"
                    | "int4"
                    | "int5"
                    | "int6"
                    | "int7"
                    | "cfloat"
                    | "float8_e4m3fn"
            )
    }

    /// The element type of a legacy typed storage class (`FloatStorage`...).
    /// `UntypedStorage` is bytes.
    pub(crate) fn from_storage_name(name: &str) -> Option<DType> {
        Some(match name {
            "DoubleStorage" => DType::F64,
            "FloatStorage" => DType::F32,
            "HalfStorage" => DType::F16,
            "BFloat16Storage" => DType::BF16,
            "ComplexDoubleStorage" => DType::C128,
            "ComplexFloatStorage" => DType::C64,
            "LongStorage" => DType::I64,
            "IntStorage" => DType::I32,
            "ShortStorage" => DType::I16,
            "CharStorage" => DType::I8,
            "ByteStorage" | "UntypedStorage" => DType::U8,
            "BoolStorage" => DType::Bool,
            "QInt8Storage" => DType::I8,
            "QUInt8Storage" | "QUInt4x2Storage" | "QUInt2x4Storage" => DType::U8,
            "QInt32Storage" => DType::I32,
            _ => return None,
        })
    }
}

/// IEEE binary16 (float16) bits to f32: exact for every value; an
/// infinity stays one, a NaN keeps its sign and payload (shifted up) and
/// is quiet.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exponent = u32::from((h >> 10) & 0x1f);
    let mantissa = u32::from(h & 0x03ff);
    match exponent {
        // Zero and subnormals: the mantissa in units of 2^-24, exact in
        // an f32.
        0 => {
            let magnitude = mantissa as f32 * (1.0 / 16_777_216.0);
            f32::from_bits(sign | magnitude.to_bits())
        }
        0x1f if mantissa == 0 => f32::from_bits(sign | 0x7f80_0000),
        // A NaN comes out quiet, as the hardware conversion gives it.
        0x1f => f32::from_bits(sign | 0x7fc0_0000 | (mantissa << 13)),
        // Rebias the exponent from 15 to 127.
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

/// f32 to float16 bits, rounding to nearest even: beyond the largest
/// finite float16 (65504, ties included) an infinity, below half the
/// smallest subnormal a signed zero. A NaN stays a quiet NaN with its sign
/// and the top of its payload.
pub(crate) fn f32_to_f16(f: f32) -> u16 {
    let bits = f.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = (bits >> 23) & 0xff;
    let mantissa = bits & 0x007f_ffff;
    if exponent == 0xff {
        return if mantissa == 0 {
            sign | 0x7c00
        } else {
            sign | 0x7e00 | (mantissa >> 13) as u16
        };
    }
    // float16's exponents 1..=30 are f32's 113..=142.
    if exponent >= 143 {
        return sign | 0x7c00;
    }
    if exponent >= 113 {
        let high = ((exponent - 112) << 10) | (mantissa >> 13);
        let rest = mantissa & 0x1fff;
        let up = rest > 0x1000 || (rest == 0x1000 && high & 1 == 1);
        // A carry out of the mantissa bumps the exponent, up to infinity.
        return sign | (high + u32::from(up)) as u16;
    }
    // A float16 subnormal (or zero): the value in units of 2^-24, the
    // full significand shifted right, rounded; a carry into 0x400 is the
    // smallest normal, encoded the same way.
    let shift = 126 - exponent;
    if shift > 24 {
        return sign;
    }
    let significand = mantissa | 0x0080_0000;
    let high = significand >> shift;
    let rest = significand & ((1 << shift) - 1);
    let halfway = 1 << (shift - 1);
    let up = rest > halfway || (rest == halfway && high & 1 == 1);
    sign | (high + u32::from(up)) as u16
}

/// A Rust type a tensor's elements can be read as: each has exactly one
/// [`DType`], and every bit pattern is a valid value. Implemented for
/// `f64`, `f32`, the signed and unsigned integers of 8 to 64 bits
/// (quantized tensors read as their integer representation), and with the
/// `half` feature (on by default) `half::f16` and `half::bf16` (without
/// it, F16 and BF16 tensors read as `f32` through
/// [`ReadAs`](crate::cast::ReadAs), or as bytes). Not for `bool` (its bytes may
/// be any value in a file): read BOOL tensors as bytes with `data()`.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The element type this Rust type reads.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(
            impl sealed::Sealed for $t {}
            impl Element for $t {
                const DTYPE: DType = DType::$d;
            }
        )*
    };
}

element! {
    f64 => F64,
    f32 => F32,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    u8 => U8,
    u16 => U16,
    u32 => U32,
    u64 => U64,
}

#[cfg(feature = "half")]
element! {
    half::f16 => F16,
    half::bf16 => BF16,
}

/// Parses the names [`DType::name`] gives (`F32`, `bf16`, `F8_E4M3`...),
/// ignoring ASCII case and surrounding space.
impl FromStr for DType {
    type Err = Error;

    fn from_str(text: &str) -> Result<DType> {
        let text = text.trim();
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidSpec,
                    format!(
                        "unknown dtype {text:?}: the names are F32, BF16, F8_E4M3, I64, BOOL..."
                    ),
                )
            })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive: a new variant fails to compile here until it is placed.
    fn position(d: DType) -> usize {
        match d {
            DType::F64 => 0,
            DType::F32 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            DType::F8E4M3 => 4,
            DType::F8E5M2 => 5,
            DType::F8E4M3Fnuz => 6,
            DType::F8E5M2Fnuz => 7,
            DType::F8E8M0 => 8,
            DType::F4E2M1X2 => 9,
            DType::C32 => 10,
            DType::C64 => 11,
            DType::C128 => 12,
            DType::I8 => 13,
            DType::I16 => 14,
            DType::I32 => 15,
            DType::I64 => 16,
            DType::U8 => 17,
            DType::U16 => 18,
            DType::U32 => 19,
            DType::U64 => 20,
            DType::Bool => 21,
        }
    }

    #[test]
    fn all_lists_every_dtype_once_and_names_parse_back() {
        for (i, d) in DType::ALL.into_iter().enumerate() {
            assert_eq!(position(d), i);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(
                format!(" {} ", d.name().to_lowercase())
                    .parse::<DType>()
                    .unwrap(),
                d
            );
        }
        let err = "float".parse::<DType>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSpec);
        assert!(err.to_string().contains("unknown dtype \"float\""), "{err}");
    }
}

//! Where storages go: the saved locations, the target devices, the
//! [`Mapper`] that decides, and the [`DeviceMap`] that records its
//! decisions (a [`Placement`] per storage).
//!
//! Mapping is pure: it needs no GPU, so every strategy is tested on every
//! machine. The device crate executes a device map.

mod device_map;
mod location;
mod mappers;

pub use crate::glob::glob;
pub use device_map::{DeviceMap, Placement};
pub use location::{Device, Location, MapLocation, MAP_LOCATION_GRAMMAR};
pub use mappers::{
    parse_size, Balanced, Budget, BudgetSpec, ByName, BySize, Choices, First, Keep, Mapper,
    StorageRequest, Table, To,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glob::glob_captures;

    #[test]
    fn budgets_and_sizes_parse() {
        let budget = |t: &str| t.parse::<BudgetSpec>();
        assert_eq!(budget("0.9").ok(), Some(BudgetSpec::Share(0.9)));
        assert_eq!(budget("1").ok(), Some(BudgetSpec::Share(1.0)));
        assert_eq!(budget("20GiB").ok(), Some(BudgetSpec::Bytes(20 << 30)));
        assert_eq!(budget("512MB").ok(), Some(BudgetSpec::Bytes(512_000_000)));
        assert_eq!(budget("1000000").ok(), Some(BudgetSpec::Bytes(1_000_000)));
        assert_eq!(budget("80%").ok(), Some(BudgetSpec::Share(0.8)));
        for bad in ["0%", "120%", "1.5", "-3", "lots", "0"] {
            assert!(budget(bad).is_err(), "{bad}");
        }
        let small = budget("2").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(small.contains("2GiB") && small.contains("80%"), "{small}");
        assert_eq!(parse_size("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_size("2 KiB"), Some(2048));
        assert_eq!(parse_size("1e30"), None);
        assert_eq!(parse_size("99999999TiB"), None);
        // A share rounds down; bytes are per GPU.
        let totals = [(0, 1000), (3, 10)];
        assert_eq!(
            format!("{:?}", BudgetSpec::Share(0.55).budget(&totals)),
            format!(
                "{:?}",
                Budget::new(vec![(Device::Cuda(0), 550), (Device::Cuda(3), 5)])
            )
        );
    }

    #[test]
    fn locations_parse_and_print() {
        for tag in [
            "cpu", "cuda", "cuda:3", "mps", "meta", "xpu:1", "hpu", "mtia:0", "npu:2", "cuda:x",
        ] {
            assert_eq!(Location::parse(tag).to_string(), tag);
        }
        assert_eq!(Location::parse("cuda:3"), Location::Cuda(Some(3)));
        assert_eq!(Location::parse("cuda:x"), Location::Other("cuda:x".into()));
        assert_eq!(
            Location::parse("cuda").restore().ok(),
            Some(Device::Cuda(0))
        );
        let e = Location::parse("npu:2").restore().expect_err("unknown");
        assert_eq!(
            e.message(),
            "don't know how to restore data location of torch.storage.UntypedStorage (tagged with npu:2)"
        );
        assert_eq!(
            e.hint(),
            Some(&crate::advice::Hint::MapLocation {
                from: Some("npu:2".into()),
                to: Some("cpu".into())
            })
        );
        assert!(Location::Mps.restore().is_err());
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cuda".parse::<Device>().ok(), Some(Device::Cuda(0)));
        assert_eq!("cuda:2".parse::<Device>().ok(), Some(Device::Cuda(2)));
        assert_eq!("cpu".parse::<Device>().ok(), Some(Device::Host));
        assert_eq!("meta".parse::<Device>().ok(), Some(Device::Meta));
        // Typed by people: any case.
        assert_eq!("CPU".parse::<Device>().ok(), Some(Device::Host));
        assert_eq!("Cuda:1".parse::<Device>().ok(), Some(Device::Cuda(1)));
        assert!("AUTO".parse::<super::MapLocation>().is_ok());
        assert!("mps".parse::<Device>().is_err());
        assert!("cuda:-1".parse::<Device>().is_err());
    }

    #[test]
    fn globs() {
        assert!(glob("encoder.*", "encoder.layers.0.weight"));
        assert!(!glob("encoder.*", "decoder.layers.0.weight"));
        assert!(glob("*embed*", "model.embed_tokens.weight"));
        assert!(glob("layers.?.weight", "layers.3.weight"));
        assert!(!glob("layers.?.weight", "layers.12.weight"));
        assert!(glob("*", ""));
        assert!(!glob("a", ""));
        assert_eq!(
            glob_captures("encoder.*.weight", "encoder.layers.0.weight"),
            Some(vec!["layers.0"])
        );
        assert_eq!(glob_captures("*.*", "a.b.c"), Some(vec!["a", "b.c"]));
        assert_eq!(glob_captures("x*y*z", "x1y2z"), Some(vec!["1", "2"]));
        assert_eq!(glob_captures("pre*", "prefix"), Some(vec!["fix"]));
    }
}

use workflow_core::prelude::*;

mod billing {
    use workflow_core::prelude::*;

    #[step(name = "billing.charge")]
    pub async fn charge(cents: u64) -> Result<u64> {
        Ok(cents)
    }
}

mod legacy {
    use workflow_core::prelude::*;

    #[step(name = "billing.charge")]
    pub async fn charge_card(cents: u64) -> Result<u64> {
        Ok(cents)
    }
}

#[workflow]
async fn checkout(cents: u64) -> Result<u64> {
    Ok(billing::charge(cents).await? + legacy::charge_card(cents).await?)
}

fn main() {}

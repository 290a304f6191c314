// The family templates (src/generation/family_templates.h) under the name the generation tests use.
#pragma once

#include "generation/family_templates.h"

namespace tandem::gen::testdata {
using gen::FamilyTemplate;
using gen::kFamilyTemplates;
}  // namespace tandem::gen::testdata
